#!/bin/sh
# The one protoc step, shared by `make proto` (dev, with type stubs) and the image builds.
# Usage: proto/generate.sh PYTHON OUT_DIR [extra protoc arguments...]
# PYTHON must have grpcio-tools installed; every .proto under this folder is compiled.
set -eu
python="$1"
out="$2"
shift 2
root="$(dirname "$0")"
well_known="$("$python" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')"
mkdir -p "$out"
# shellcheck disable=SC2046 # file names contain no spaces; word splitting is intended
"$python" -m grpc_tools.protoc -I "$root" -I "$well_known" \
  --python_out="$out" --grpc_python_out="$out" "$@" \
  $(find "$root" -name '*.proto' | sort)
