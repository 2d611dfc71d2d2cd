"""atheris target ``nats_protocol``: see fuzz/fuzzing.py and tidelog.testing.fuzz_targets."""

from fuzzing import fuzz

if __name__ == "__main__":
    fuzz("nats_protocol")
