#!/usr/bin/env bash
# A GPU session's checks in one call of the device tool (run from the repository root):
# AOTInductor packages on CUDA (benchmarks/aoti_cuda.py), the cuda tests, the default chain
# serving beside reduce-overhead with its race (benchmarks/gpu_serve.py), and the real
# suite on CUDA with inductor's CUDA graphs variant in a chain. Results under $OUT.
#   bash benchmarks/gpu_session.sh            # everything, about 8 minutes on an H100/H200
#   STEPS="tests" bash benchmarks/gpu_session.sh
set -u
OUT=${OUT:-gpu-out}
STEPS=${STEPS:-"aoti tests serve bench"}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then  # what the GPU image lacks (tenacity), carried as wheels
  python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl  # children see it too
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import torch, onnxruntime; print(torch.__version__, torch.cuda.get_device_name(0), onnxruntime.__version__)"
uptime
for step in $STEPS; do
  case $step in
    aoti) timeout ${AOTI_S:-130} python3 benchmarks/aoti_cuda.py --out "$OUT" 2>&1 | tee "$OUT/aoti.log" ;;
    # SIGINT, not SIGTERM: pytest stops and still prints which tests failed and why
    tests) timeout -s INT -k 20 ${TESTS_S:-230} python3 -m pytest -q -n 8 --dist loadfile -rfEsx --tb=short \
             -m "cuda or ort_cuda or tensorrt" ${TESTS:-} 2>&1 | tee "$OUT/cuda-tests.log" ;;
    serve) timeout ${SERVE_S:-240} python3 benchmarks/gpu_serve.py --calls 2000 --rounds 10 2>&1 | tee "$OUT/serve.log" ;;
    bench) timeout 200 python3 -m chain bench --suite real --device cuda \
             --models mlp_b1,bert,gpt2_decode --repeats 10 --warmup 3 --backends inductor,cudagraphs \
             --chains tensorrt,cudagraphs,onnxruntime,eager tensorrt,inductor,cudagraphs,onnxruntime,eager \
             --out "$OUT/bench" 2>&1 | tail -40 | tee "$OUT/bench.log" ;;
  esac
  uptime
done
