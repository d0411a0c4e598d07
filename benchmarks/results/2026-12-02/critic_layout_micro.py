"""The critic's big pass (2 critics, 7936 rows, 256x256), forward and backward, four layouts; one thread."""

import time

import torch

from arl_models.nets import EnsembleCritic, mlp

torch.set_num_threads(1)
torch.manual_seed(0)
ROWS, OBS, ACT, H = 7936, 11, 3, 256
obs, act = torch.randn(ROWS, OBS), torch.rand(ROWS, ACT)
ens = EnsembleCritic(OBS, ACT, (H, H), 2)
members = [mlp(OBS + ACT, (H, H), 1) for _ in range(2)]


def fused() -> None:
    ens(obs, act).sum().backward()


def chunked(k: int = 4) -> None:
    for o, a in zip(obs.chunk(k), act.chunk(k), strict=True):
        ens(o, a).sum().backward()


def per_member() -> None:
    x = torch.cat([obs, act], -1)
    sum(m(x).sum() for m in members).backward()


def per_member_chunked(k: int = 4) -> None:
    for xc in torch.cat([obs, act], -1).chunk(k):
        sum(m(xc).sum() for m in members).backward()


LAYOUTS = [
    ("fused baddbmm (E=2, 7936 rows)", fused),
    ("fused, 4 chunks of 1984 rows", chunked),
    ("per member nn.Linear", per_member),
    ("per member, 4 chunks", per_member_chunked),
]

if __name__ == "__main__":
    for name, fn in LAYOUTS:
        for _ in range(3):
            fn()
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(5):
                fn()
            ts.append((time.perf_counter() - t0) / 5)
        print(f"{name:34s} {1e3 * min(ts):7.1f} ms (min of 5), median {1e3 * sorted(ts)[2]:7.1f} ms")
