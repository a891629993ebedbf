"""Memory of the whole-model training step on one GPU (diagnostic for issue 15's whole-model check):
allocated after build, after forward, and how many weight-gradient hooks fired / grads are held when the
backward stops. Usage (device): python3 scripts/wholestep_train_mem.py CONFIG TOKENS"""
import sys

import torch

from k3sim.calibration.wholestep import spec as S
from k3sim.calibration.wholestep.model import WholeStepModel

cfg, n = sys.argv[1], int(sys.argv[2])
spec = S.load_specs(S.SPECS_PATH)[cfg]
m = WholeStepModel(spec, grad=True, free_grads=True)
fired = []
for p in m.params:
    p.register_post_accumulate_grad_hook(lambda p: fired.append(p.numel()))
gb = lambda: torch.cuda.memory_allocated() / 1e9  # noqa: E731
print(f"built: {gb():.1f} GB, {len(m.params)} params", flush=True)
st = S.StepShape(chunk=n, seqs=1, train=True)
x = torch.randint(0, spec.vocab_local, (n,), device="cuda")
y = m.forward(x, st)
torch.cuda.synchronize()
print(f"after forward: {gb():.1f} GB", flush=True)
dy = torch.randn_like(y)
try:
    y.backward(dy)
    torch.cuda.synchronize()
    print(f"after backward: {gb():.1f} GB, peak {torch.cuda.max_memory_allocated() / 1e9:.1f}", flush=True)
except torch.OutOfMemoryError as e:
    print(f"OOM: {str(e)[:120]}", flush=True)
held = sum(p.grad.numel() * 2 for p in m.params if p.grad is not None) / 1e9
print(f"hooks fired {len(fired)} of {len(m.params)}; grads held {held:.1f} GB", flush=True)
