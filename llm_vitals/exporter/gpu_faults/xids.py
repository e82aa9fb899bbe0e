"""NVIDIA's Xid catalog, reduced to what the exporter must decide: may a restart of the server fix it?

NVIDIA's Xid catalog for Ampere and newer GPUs (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html)
gives each Xid a "Resolution Bucket (Immediate Action)". The numbers below are that column as
NVIDIA's own NVSentinel ships it (its xiderrorsmapping.csv: RESTART_APP, RESET_GPU, RESTART_BM,
RESTART_VM, IGNORE and the WORKFLOW_* entries), folded into four buckets:

- `ignore`: informational (63 a row marked for remapping, 92 excessive single-bit ECC interrupts);
- `restart_app`: the catalog's RESTART_APP. A restart of the application (the pod) may fix it: the
  GPU is fine (94 a contained ECC error: the driver contained it, only the application that touched
  the page is killed; 13/31/43/45 the application's own faults and their cleanup);
- `reset_gpu`: RESET_GPU and the workflows that end in a GPU reset (48 double-bit ECC, 64 a failed
  row remap, 74 and 144-150 NVLink, 95 an uncontained ECC error, 119/120 the GSP firmware). A restart on
  the same GPU fails the same way;
- `reboot_node`: RESTART_BM / RESTART_VM (79 fallen off the bus, 160 channel retirement, 151 key rotation);
- `follow`: 154 ("GPU recovery action changed"). The catalog gives it no action of its own: the Xid it
  comes with decides (62, then 154, then 45, as a real driver logs them, is the 62's GPU reset). Where
  that Xid cannot have been seen (a source that keeps only the last Xid), a lone 154 is taken as
  `reset_gpu`: the driver asked for a recovery, and the reason was lost (dcgm.py's rule).

159 (a CHI non-fatal error) is `ignore`, as the catalog says.

Only `reset_gpu` and `reboot_node` are a GPU fault (restart refused; `cordon_and_move` where
configured). An Xid the table does not know (a newer driver's) counts as `reset_gpu`: NVIDIA's
device plugin likewise marks a GPU unhealthy on every Xid it does not know to be the application's.
`gpu_faults.xid_buckets` overrides any number. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

Bucket = Literal["follow", "ignore", "restart_app", "reset_gpu", "reboot_node"]
BUCKETS: tuple[Bucket, ...] = get_args(Bucket)
# Worse last: a held fault is only ever replaced by a worse one.
SEVERITY: Mapping[Bucket, int] = {bucket: rank for rank, bucket in enumerate(BUCKETS)}
# A restart on the same GPU cannot fix these.
FAULT_BUCKETS: frozenset[Bucket] = frozenset({"reset_gpu", "reboot_node"})
WORDS: Mapping[Bucket, str] = {
    "follow": "the Xid it came with decides", "ignore": "informational",
    "restart_app": "an application restart may fix it",
    "reset_gpu": "the GPU needs a reset", "reboot_node": "the node needs a reboot",
}
UNKNOWN_BUCKET: Bucket = "reset_gpu"
# Xid 154's bucket: it names no action of its own (the module docstring).
FOLLOW: Bucket = "follow"


def _each(bucket: Bucket, *numbers: int | range) -> dict[int, Bucket]:
    out: dict[int, Bucket] = {}
    for number in numbers:
        out.update(dict.fromkeys(number if isinstance(number, range) else (number,), bucket))
    return out


# The catalog's immediate action per Xid (see the module docstring for the source).
CATALOG: Mapping[int, Bucket] = {
    **_each("restart_app", 8, 11, 13, 25, 31, 32, range(39, 42), 45, 60, range(68, 73), range(75, 78), 80,
            range(82, 87), 88, 89, 94, range(96, 106), range(126, 136), 139),
    **_each("ignore", 14, 37, 38, 43, 44, 63, 66, 67, 92, 93, 106, 107, 121, 137, 141, 152, 153, 157, 159, 161),
    **_each("reset_gpu", 46, 48, 62, 64, 74, 95, 109, 110, 119, 120, 136, 140, 143, range(144, 151), 155,
            156, 158),
    **_each("follow", 154),
    **_each("reboot_node", 79, 151, 160),
}


@dataclass(frozen=True)
class XidRules:
    """The catalog with the operator's overrides (`gpu_faults.xid_buckets`) on top."""

    overrides: Mapping[int, Bucket] = field(default_factory=dict)

    @classmethod
    def of(cls, overrides: Mapping[int, Bucket] | None = None, also_faults: Iterable[int] = ()) -> XidRules:
        """Rules from config: `xid_buckets`, and the older per-source lists whose Xids are taken as `reset_gpu`."""
        merged: dict[int, Bucket] = {xid: "reset_gpu" for xid in also_faults}
        merged.update(overrides or {})
        return cls(merged)

    def bucket(self, xid: int) -> Bucket:
        """The bucket of one Xid: the override, else the catalog's, else UNKNOWN_BUCKET."""
        return self.overrides.get(xid) or CATALOG.get(xid) or UNKNOWN_BUCKET

    def is_fault(self, xid: int) -> bool:
        """Whether this Xid is a GPU fault: a restart on the same GPU will not fix it."""
        return self.bucket(xid) in FAULT_BUCKETS

    def rank(self, xid: int) -> int:
        return SEVERITY[self.bucket(xid)]

    def worst(self, xids: Iterable[int]) -> int | None:
        """The most severe faulty Xid of `xids` (the first of equals), or None when none is a fault."""
        faulty = [xid for xid in xids if self.is_fault(xid)]
        return max(faulty, key=self.rank) if faulty else None

    def words(self, xid: int) -> str:
        """What the catalog says to do, for a detail a human reads."""
        return WORDS[self.bucket(xid)]
