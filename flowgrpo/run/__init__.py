"""Run bookkeeping: what a run writes and how it stops, independent of the method.

    run_dir.py      the run folder: config, metrics, logs, samples and their manifests (the gallery's input)
    checkpoint.py   atomic, pickle-free checkpoint folders (safetensors + JSON)
    interrupts.py   SIGINT/SIGTERM: stop at the next model call, save, print how to resume
    threads.py      torch's CPU threads per process, and why
    errors.py       UserError: bad input that the entry points print as one line (exit status 2)
    paths.py        where the shipped configs, C++ sources and built-in models are
"""
