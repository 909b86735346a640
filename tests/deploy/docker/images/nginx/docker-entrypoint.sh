#!/bin/sh
# Stand-in for the official nginx image's entrypoint (docker-entrypoint.sh running
# 20-envsubst-on-templates.sh), written here because no registry is reachable in CI.
# Same rule as the official script: each $NGINX_ENVSUBST_TEMPLATE_DIR/X.template becomes
# $NGINX_ENVSUBST_OUTPUT_DIR/X through `envsubst`, substituting only the environment variables
# whose names match the awk regex NGINX_ENVSUBST_FILTER (all of them when it is empty).
set -eu

render_templates() {
    template_dir="${NGINX_ENVSUBST_TEMPLATE_DIR:-/etc/nginx/templates}"
    suffix="${NGINX_ENVSUBST_TEMPLATE_SUFFIX:-.template}"
    output_dir="${NGINX_ENVSUBST_OUTPUT_DIR:-/etc/nginx/conf.d}"
    filter="${NGINX_ENVSUBST_FILTER:-}"
    # shellcheck disable=SC2016,SC2046
    defined_envs=$(printf '${%s} ' $(awk "END { for (name in ENVIRON) { print ( name ~ /${filter}/ ) ? name : \"\" } }" </dev/null))
    [ -d "$template_dir" ] || return 0
    if [ ! -w "$output_dir" ]; then
        echo "$0: ERROR: $template_dir exists, but $output_dir is not writable" >&2
        return 0
    fi
    find "$template_dir" -follow -type f -name "*$suffix" -print | while read -r template; do
        relative_path="${template#"$template_dir/"}"
        output_path="$output_dir/${relative_path%"$suffix"}"
        mkdir -p "$output_dir/$(dirname "$relative_path")"
        echo "$0: Running envsubst on $template to $output_path" >&2
        envsubst "$defined_envs" <"$template" >"$output_path"
    done
}

if [ "${1:-}" = nginx ] || [ "${1:-}" = nginx-debug ]; then
    render_templates
fi
exec "$@"
