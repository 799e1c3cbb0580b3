# Source this on a lent GPU machine to get a TVM that compiles (issue 24's CUDA path, tests/test_gpu.py).
#
# The machines have torch and CUDA but no TVM, and a call carries at most 64 MiB, less than TVM's compiler
# library (259 MB; 62 MB as xz). So it travels in two halves, in two calls made back to back while the machine is
# still warm: the first call copies .tvmstash1/tc.xz.aa to /root; the second carries .tvmstash2 (the other half,
# the TVM Python package without the compiler library, and the apache-tvm-ffi wheel for the machine's Python)
# and sources this file. How the stash is built: docs/gpu.md ("TVM on the GPU machine").
set -eo pipefail
S=/root/tvmsite
if [ ! -f "$S/tvm/lib/libtvm_compiler.so" ]; then
    mkdir -p "$S"
    cat /root/tc.xz.aa .tvmstash2/tc.xz.ab | xz -d -T0 >/root/libtvm_compiler.so
    tar -xJf .tvmstash2/tvmpy.tar.xz -C "$S"
    mv /root/libtvm_compiler.so "$S/tvm/lib/"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$S" .tvmstash2/apache_tvm_ffi-*.whl
fi
CUDART=$(find /usr/local /opt -name 'libcudart.so.13*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH="$(dirname "$CUDART"):${LD_LIBRARY_PATH:-}"
export PYTHONPATH="$S:$PWD:${PYTHONPATH:-}"
python3 -c "import tvm, tvm_ffi; print('tvm', tvm.__version__, 'ffi', tvm_ffi.__version__, 'cudart', '$CUDART')"
set +e
