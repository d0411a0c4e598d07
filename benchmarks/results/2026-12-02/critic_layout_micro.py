import time, torch, torch.nn.functional as F
from arl_models.nets import EnsembleCritic, mlp
torch.set_num_threads(1); torch.manual_seed(0)
R, O, A, H = 7936, 11, 3, 256
obs, act = torch.randn(R, O), torch.rand(R, A)
ens = EnsembleCritic(O, A, (H, H), 2)
members = [mlp(O + A, (H, H), 1) for _ in range(2)]
def fused(): ens(obs, act).sum().backward()
def chunked(k=4):
    for o, a in zip(obs.chunk(k), act.chunk(k)): ens(o, a).sum().backward()
def per_member():
    x = torch.cat([obs, act], -1)
    sum(m(x).sum() for m in members).backward()
def per_member_chunked(k=4):
    x = torch.cat([obs, act], -1)
    for xc in x.chunk(k): sum(m(xc).sum() for m in members).backward()
for name, fn in [("fused baddbmm (E=2, 7936 rows)", fused), ("fused, 4 chunks of 1984 rows", chunked), ("per member nn.Linear", per_member), ("per member, 4 chunks", per_member_chunked)]:
    for _ in range(3): fn()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter(); [fn() for _ in range(5)]; ts.append((time.perf_counter() - t0) / 5)
    print(f"{name:34s} {1e3 * min(ts):7.1f} ms (min of 5), median {1e3 * sorted(ts)[2]:7.1f} ms")
