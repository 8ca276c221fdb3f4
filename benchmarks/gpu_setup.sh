# Source on the GPU machine (device tool) at the start of a command, from the repository root:
#     . benchmarks/gpu_setup.sh
# Installs the wheels carried in .whl/ (made here with the device README's `pip download` line: sqlalchemy,
# alembic, mako, jsonschema(+specifications), referencing, rpds-py, platformdirs, pulp, highspy, greenlet,
# nvidia-cudnn-frontend 1.23; pulp 4.2's import chain: orloge, cpsat-logutils, pydantic, pydantic-core,
# annotated-types, typing-inspection, typing-extensions) into /tmp/site, and makes the checkout importable as
# installed: ucudnn.server and ucudnn.kernels are links beside the package (what pyproject's package-dir does for an
# install), so `python3 -m pytest` and the benchmarks import this tree's code.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || return 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
[ -e ucudnn/server ] || ln -s ../server ucudnn/server
[ -e ucudnn/kernels ] || ln -s ../kernels ucudnn/kernels
# bytecode, as pip writes it on install (the image sets no-compile installs and may not write .pyc at import):
# without it every fresh process recompiles SQLAlchemy, Alembic and ucudnn, ~1.4 s a first call would not pay
python3 -m compileall -q -j 0 /tmp/site ucudnn server kernels >/dev/null 2>&1
python3 -c "import ucudnn, ucudnn.kernels, ucudnn.server, cudnn; print('ucudnn', ucudnn.__file__, 'cudnn-frontend', cudnn.__version__)"
