#!/bin/sh
# The wheels the voice study's DRA modes need on the GPU machine, whose image lacks them (it has
# torch, transformers, grpcio, protobuf, aiohttp, yarl, attrs, requests, PyYAML, nvidia-ml-py,
# prometheus-client): the kubernetes client and pydantic (nodeagent.kube), structlog and tenacity
# (nodeagent), kmock and jsonpatch (the API server of the claims, tests/support/dra.py). Versions
# are those of the project's .venv (pyproject.toml's bounds); urllib3 and typing-extensions
# because kubernetes 37 needs newer ones than an image may have; for `pytest -m gpu tests/gpu`
# (the suite's conftest builds the agent) also the metrics endpoint's server (uvicorn, httptools,
# h11, click) and kubernetes-validate with its schema stack (tests/gpu/dra/test_real_dra.py,
# 22 MiB of the ~34). One version of each.
#
# Run from the repository root (no arguments: into .whl/, which .git/info/exclude must ignore:
# `echo /.whl/ >> .git/info/exclude`); then name .whl in the device call's carry and begin its
# command with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit;
set -eu
dir=${1:-.whl}
get() {
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$dir" "$1"
}
get kubernetes==37.0.2
get pydantic==2.14.4
get pydantic-core==2.50.5
get annotated-types==0.8.0
get typing-inspection==0.4.5
get typing-extensions==4.16.0
get urllib3==2.8.0
get durationpy==0.11
get websocket-client==1.9.2
get requests-oauthlib==2.0.0
get oauthlib==4.0.1
get python-dateutil==4.0.0
get structlog==26.1.0
get tenacity==9.2.1
get kmock==0.8
get jsonpatch==1.48
get jsonpointer==3.12
get uvicorn==0.55.0
get httptools==0.9.0
get h11==0.16.0
get click==8.5.1
get kubernetes-validate==1.37.0
get jsonschema==4.26.0
get jsonschema-specifications==2025.9.1
get referencing==0.37.0
get rpds-py==2026.9.1
get importlib_resources==7.1.0
du -sh "$dir"
