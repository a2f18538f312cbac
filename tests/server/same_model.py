"""Exits non-zero unless every worker's parameters (raw fp32, as sketchsgd_test_worker --out
writes them) equal the model in a server checkpoint (server/checkpoint.cpp's layout).

    python3 same_model.py CHECKPOINT WORKER_FILE...
"""
import struct
import sys


def main(checkpoint, *workers):
    ck = open(checkpoint, "rb").read()
    dim = struct.unpack_from("<Q", ck, 24)[0]
    spec_len = struct.unpack_from("<I", ck, 32)[0]
    params = ck[36 + spec_len: 36 + spec_len + 4 * dim]
    for w in workers:
        if open(w, "rb").read() != params:
            sys.exit(f"FAIL: {w} differs from the model in {checkpoint}")
    print(f"{len(workers)} workers hold the model of {checkpoint}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
