#!/usr/bin/env bash
# On the GPU host, after every part arrived: join, check, install vLLM 0.32.0 + torch 2.13.0 into
# /tmp/site032 (the host's own torch 2.11 stays; /tmp/site032 shadows it via PYTHONPATH).
#   bash install.sh      (from the checkout root: engine/vllm_plugin is installed beside vLLM)
set -euo pipefail
cat /tmp/chunks/whl.tar.part* > /tmp/whl.tar
[ "$(sha256sum /tmp/whl.tar | cut -d' ' -f1)" = "$(cat /tmp/chunks/SHA256)" ] || { echo "sha256 mismatch: a part is missing or broken" >&2; exit 1; }
rm -rf /tmp/whl && mkdir -p /tmp/whl && tar -xf /tmp/whl.tar -C /tmp/whl && rm /tmp/whl.tar
# Unpacked 16 at a time: the files and modes pip --no-deps --target laid out (compared 2026-12-07)
python3 - /tmp/whl/.whl/*.whl <<'EOF'
import os, shutil, sys, zipfile
from concurrent.futures import ProcessPoolExecutor
def unpack(wheel, top="/tmp/site032"):
    with zipfile.ZipFile(wheel) as z:
        for i in z.infolist():
            p = i.filename.split("/")
            if p[0].endswith(".data"):  # a .data folder's purelib/platlib go to the top
                p = p[2:] if p[1:2] in (["purelib"], ["platlib"]) else []
            if p and not i.is_dir():
                os.makedirs(os.path.dirname(d := os.path.join(top, *p)), exist_ok=True)
                with z.open(i) as src, open(d, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                os.chmod(d, 0o755 if (i.external_attr >> 16) & 0o111 else 0o644)
with ProcessPoolExecutor(16) as pool:
    list(pool.map(unpack, sorted(sys.argv[1:], key=os.path.getsize, reverse=True)))
EOF
rm -rf /tmp/whl
. "$(dirname "$0")/env.sh"
# The project's vLLM plugin (engine/vllm_plugin, off with VLLM_PLUGINS=) beside vLLM, its entry point
# where vLLM's loader finds it through PYTHONPATH; built by the host's own setuptools (no index).
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site032 engine/vllm_plugin
# The layout service (engine/layout, issue 36) beside them, for scripts/serve.sh and
# bench.gpu.run (`python3 -m ocrvl_layout`); everything it imports is the host's or vLLM's.
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site032 engine/layout
python3 -c "import importlib.metadata as m; print('vllm plugins:', sorted(p.name for p in m.entry_points(group='vllm.general_plugins')))"
python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'cudnn', torch.backends.cudnn.version(), 'nccl', torch.cuda.nccl.version())"
# What only the GPU can tell: cuDNN 9.20 runs a conv (the vision patch embedding), FA3 is usable,
# and the host's own packages that vLLM 0.32 wants newer than 0.23 did.
python3 -c "
import importlib.metadata as m, torch
from vllm.vllm_flash_attn.flash_attn_interface import is_fa_version_supported
x = torch.randn(1, 3, 28, 28, device='cuda', dtype=torch.bfloat16)
torch.nn.functional.conv2d(x, torch.randn(8, 3, 14, 14, device='cuda', dtype=torch.bfloat16), stride=14)
print('conv ok; fa3', is_fa_version_supported(3))
print({p: m.version(p) for p in ['huggingface_hub', 'tokenizers', 'requests', 'pillow', 'aiohttp', 'filelock', 'setuptools']})
"
