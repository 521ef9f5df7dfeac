import torch, time
from chain import chain
from tests.regions_models import bert
torch.manual_seed(0)
m = bert(4)
b = chain("onnxruntime", "inductor", "eager", mode="fastest", regions=True)
f = torch.compile(m, backend=b)
x = torch.randint(0, 100, (2, 16))
t = time.time()
with torch.no_grad():
    out = f(x)
    ref = m(x)
print("compile+first", time.time() - t)
print(torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state, rtol=1e-4, atol=1e-4))
for g in b.report.graphs:
    for a in g.attempts:
        print(a.backend, a.status.value, a.latency_ms, a.reason[:200])
        if a.backend == "regions":
            import json; print(json.dumps(a.details, indent=1)[:3000])
