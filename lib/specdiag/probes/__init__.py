"""GPU utilization probes: NVML/GPM sampling and Nsight Compute counters (notebook 02)."""
