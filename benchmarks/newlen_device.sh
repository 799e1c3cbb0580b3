# The device check of a new length's CUDA build (issue 24 item 4 on the GPU path), about 2 minutes on an H200.
# Source benchmarks/tvm_on_device.sh first (a TVM that compiles); writes under $OUT. Usage:
#   OUT=/some/dir COMMIT=<hash> bash benchmarks/newlen_device.sh
# 1. The small decoder layer end to end: first call at 128, then at the new lengths 200 and 333 (before this
#    branch: 9-10 s each on the H200), with their errors and steady times.
# 2. The dispatcher's CUDA build at 128, 200, 333 with its parts (construction, parses, NVRTC inside tvm.compile
#    as cuda_compiler), and NVRTC on the last module whole and split 2, 4, 8 ways in threads (--split: whether a
#    split build would pay on 16 cores).
set -eo pipefail
OUT=${OUT:-/tmp}
python benchmarks/torch_decoder.py --hw h200 --configs small --tokens 128 --new-lengths 200 333 \
    --methods gensorage --calls 5 --samples 3 --commit "${COMMIT:-unknown}" --out "$OUT/torch_decoder-newlen-h200.json"
python -m benchmarks.newlen_cuda --lengths 128 200 333 --split 2 4 8 --out "$OUT/newlen-cuda-build-h200.json"
