#!/usr/bin/env bash
# Download, into ./.whl of this checkout, the Python 3.12 x86-64 wheels that an offline GPU
# machine needs to tune: tqdm (the tuner's progress bar, a dependency of multibackend) and
# Dask's distributed scheduler with what it depends on (the "cluster" extra, for tuning on
# several GPUs), about 5 MB in all. The GPU image lacks them; it has torch, numpy and jinja2.
#
#   bash benchmarks/cluster-wheels.sh
#
# On the GPU machine, install them without an index and put them first on the path:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
#       && export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .whl
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 --dest .whl 'dask[distributed]==2026.8.0' tqdm==4.70.1
ls -la .whl
du -sh .whl
