"""Fixtures of the deployment tests: compose's resolved files and real nginx fronts."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.deploy.compose import BASE, filled_env_example, resolved
from tests.deploy.nginx import Nginx, free_port, running

if TYPE_CHECKING:
    from tests.conftest import GatewayServer

StartNginx = Callable[..., contextlib.AbstractContextManager[Nginx]]


@pytest.fixture(scope="session")
def compose_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """docker-compose.yml as compose resolves it from .env.example (required values filled)."""
    folder = tmp_path_factory.mktemp("compose")
    return resolved([BASE], folder, env_file=filled_env_example(folder))


@pytest.fixture(scope="session")
def nginx_env(compose_model: dict[str, Any]) -> dict[str, str]:
    """The environment compose gives the nginx container, with this machine's PATH."""
    environment: dict[str, str] = compose_model["services"]["nginx"]["environment"]
    return {"PATH": os.environ["PATH"], **environment}


def local_env(nginx_env: dict[str, str], upstream: str, **overrides: str) -> dict[str, str]:
    """The container's nginx environment moved to loopback: a free port, `upstream` behind it."""
    return {
        **nginx_env,
        "NGINX_LISTEN": f"127.0.0.1:{free_port()}",
        "NGINX_UPSTREAM": upstream.removeprefix("http://"),
        **overrides,
    }


@pytest.fixture
def start_nginx(nginx_env: dict[str, str], tmp_path: Path) -> StartNginx:
    """Start a real nginx in front of `upstream`: `with start_nginx(url, NGINX_X=...) as front`."""
    count = iter(range(1_000))

    @contextlib.contextmanager
    def start(upstream: str, **overrides: str) -> Iterator[Nginx]:
        root = tmp_path / f"nginx-{next(count)}"
        with running(root, local_env(nginx_env, upstream, **overrides)) as front:
            yield front

    return start


@pytest.fixture
def front_of(gateway: GatewayServer, start_nginx: StartNginx) -> StartNginx:
    """Start a real nginx in front of the session's real gateway, with limits given as env."""

    def start(**overrides: str) -> contextlib.AbstractContextManager[Nginx]:
        return start_nginx(gateway.url, **overrides)

    return start
