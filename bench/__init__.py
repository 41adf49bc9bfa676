"""trainctl's benchmarks (`make bench`): see bench/run.py and README.md, "Performance"."""
