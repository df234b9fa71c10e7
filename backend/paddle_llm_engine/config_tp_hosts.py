"""The tp_hosts setting parsed: which hosts run the tensor-parallel ranks."""

from __future__ import annotations


def parse_tp_hosts(text: str, size: int) -> list[tuple[str, int]]:
    """EngineConfig.tp_hosts -> [(address, ranks), ...] in rank order (the first entry is this host).

    `text`: comma-separated "address[:ranks]" entries (an IPv4 address or a host name; ranks an
    integer >= 1, default 1). Raises ValueError naming tp_hosts when an entry is empty or
    malformed, an address repeats, the ranks do not add up to `size` (tensor_parallel_size), or
    `size` is 1 (nothing to spread)."""
    out: list[tuple[str, int]] = []
    for entry in (e.strip() for e in text.split(",")):
        host, sep, count = entry.partition(":")
        host = host.strip()
        if not host or any(c.isspace() for c in host) or (sep and not count.strip().isdigit()):
            raise ValueError(f"tp_hosts: bad entry {entry!r} in {text!r} (expected address[:ranks], "
                             f"e.g. \"10.0.0.1,10.0.0.2\" or \"hostA:2,hostB:2\")")
        n = int(count) if sep else 1
        if n < 1:
            raise ValueError(f"tp_hosts: entry {entry!r} must name at least 1 rank")
        if any(h == host for h, _ in out):
            raise ValueError(f"tp_hosts: {host!r} is named twice in {text!r} (give it one entry host:ranks)")
        out.append((host, n))
    if size <= 1:
        raise ValueError(f"tp_hosts ({text!r}) needs tensor_parallel_size > 1, got {size}")
    total = sum(n for _, n in out)
    if total != size:
        raise ValueError(f"tp_hosts {text!r} names {total} ranks but tensor_parallel_size is {size}")
    return out
