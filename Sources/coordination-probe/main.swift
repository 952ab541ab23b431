// Child process for cross-process coordination tests and benchmarks.
print("coordination-probe")
