"""The parts of benchmarks/compare.py, split by job: common (paths, system names, sibling modules,
child environments), measure (host, read bandwidth, records and their statistics), workers (the
child processes compare.py starts under --worker), ours (our engine offline and through Triton),
peers (HF transformers, llama.cpp), traffic (the HTTP load clients), report (tables) and cli (the
command). Every module imports only the standard library at import time: the plot worker runs
compare.py in the peer venv, which has matplotlib and nothing of ours."""
