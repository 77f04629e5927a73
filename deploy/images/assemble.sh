#!/bin/sh
# The build stage of every service image (services/<name>/Dockerfile), in one place.
# Run from the repository root, in two steps so that the dependency layer stays cached while
# only source changes:
#   deploy/images/assemble.sh deps SERVICE DEST  DEST/venv: the third-party packages of
#       services/SERVICE/requirements.txt (hash-checked wheels only, no pip); DEST.codegen: a
#       build-only venv with grpcio-tools (requirements/proto.txt)
#   deploy/images/assemble.sh app SERVICE DEST   DEST/app: generated gRPC code, crmkit and the
#       service's package, byte-compiled (the root filesystem is read-only at run time)
set -eu
step="$1"
service="$2"
dest="$3"

install_hashed() { # VENV REQUIREMENTS: exactly the pinned, hash-checked wheels, nothing resolved
  python3 -m venv --without-pip "$1"
  python3 -m pip --python "$1/bin/python" install --quiet --no-cache-dir \
    --disable-pip-version-check --root-user-action=ignore \
    --require-hashes --no-deps --only-binary=:all: -r "$2"
}

case "$step" in
  deps)
    install_hashed "$dest/venv" "services/$service/requirements.txt"
    install_hashed "$dest.codegen" requirements/proto.txt
    ;;
  app)
    proto/generate.sh "$dest.codegen/bin/python" "$dest/app"
    cp -R libs/crmkit/src/crmkit "services/$service/src/$service" "$dest/app/"
    find "$dest/app" -name __pycache__ -prune -exec rm -rf {} +
    "$dest/venv/bin/python" -m compileall -q "$dest/app"
    ;;
  *)
    echo "usage: $0 deps|app SERVICE DEST" >&2
    exit 2
    ;;
esac
