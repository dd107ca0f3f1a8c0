#!/usr/bin/env python3
"""The sentence-transformers side of `cargo bench --bench embed`.

Encodes the texts of each `--texts` file (a JSON array of strings) with
sentence-transformers on `--device` (the CPU by default), in batches of `--batch-size` taken in file
order, exactly as the Rust side cuts them: `encode` is called once per batch,
so its own length sorting cannot regroup the texts into batches the other
side does not get. `--inner-batch-size` (default: the batch size) is
`encode`'s own `batch_size`: made smaller, each call is sorted by length and
cut into smaller model batches, as residue's CPU path cuts its calls into
micro-batches. Each file gets a warm-up over its first batches, then one
timed pass over all of its texts.

Prints one JSON object on the last line of stdout:

    {"torch": ..., "sentence_transformers": ..., "threads": N,
     "max_seq_length": 256, "batch_size": 32, "inner_batch_size": 32,
     "results": [{"file": ..., "texts": n, "seconds": s, "texts_per_s": r,
                  "cpu_seconds": c}]}

`cpu_seconds` is the process's CPU time (all threads) over the timed pass.

`--dump PATH` also writes the vectors of the first file, row by row, as
little-endian f32 (texts x dimension), for the agreement check.

Threads: `torch.set_num_threads(--threads)`; the caller also sets
OMP_NUM_THREADS, MKL_NUM_THREADS and RAYON_NUM_THREADS (the tokenizer's pool)
to the same number before Python starts.
"""

import argparse
import json
import os
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="sentence-transformers model folder")
    p.add_argument("--texts", action="append", required=True, help="JSON array of strings")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument(
        "--inner-batch-size",
        type=int,
        help="encode's own batch_size within each call (default: --batch-size)",
    )
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--warmup-batches", type=int, default=4)
    p.add_argument("--dump", help="write the first file's vectors here (f32 LE)")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda")
    p.add_argument(
        "--quantize-dynamic",
        action="store_true",
        help="run the model's Linear layers as PyTorch dynamic int8 (quantize_dynamic, qint8)",
    )
    args = p.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    import sentence_transformers
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(args.model, device=args.device)
    model.eval()
    if args.quantize_dynamic and args.device != "cpu":
        sys.exit("--quantize-dynamic runs on the CPU only (torch's quantize_dynamic)")
    if args.quantize_dynamic:
        # PyTorch's own int8 counterpart of residue's int8 encoder: every
        # nn.Linear with int8 weights and per-batch dynamic activations
        # (fbgemm, VNNI where the CPU has it).
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)

    inner = args.inner_batch_size or args.batch_size

    def encode(batch):
        return model.encode(
            batch,
            batch_size=inner,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )

    bs = args.batch_size
    results = []
    for i, path in enumerate(args.texts):
        with open(path, encoding="utf-8") as f:
            texts = json.load(f)
        batches = [texts[at : at + bs] for at in range(0, len(texts), bs)]
        for batch in batches[: args.warmup_batches]:
            encode(batch)
        vectors = []
        cpu = time.process_time()
        start = time.perf_counter()
        for batch in batches:
            vectors.append(encode(batch))
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu
        results.append(
            {
                "file": path,
                "texts": len(texts),
                "seconds": seconds,
                "texts_per_s": len(texts) / seconds,
                "cpu_seconds": cpu,
            }
        )
        if i == 0 and args.dump:
            np.concatenate(vectors).astype("<f4").tofile(args.dump)

    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "sentence_transformers": sentence_transformers.__version__,
                "threads": torch.get_num_threads(),
                "quantized": bool(args.quantize_dynamic),
                "device": args.device,
                "max_seq_length": model.max_seq_length,
                "batch_size": bs,
                "inner_batch_size": inner,
                "results": results,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
