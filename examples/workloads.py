"""The training jobs of the DDP example and the comparison scripts: data, model, loss and
evaluation, each with fixed seeds, data order and evaluation set.

| name        | model                                            | data                         | quality          |
|-------------|--------------------------------------------------|------------------------------|------------------|
| mlp         | 784-1024-1024-10 (the C++ demo's), 1.86 M params | Fashion-MNIST                | test accuracy    |
| cnn         | two 5x5 convolutions and two dense layers        | Fashion-MNIST                | test accuracy    |
| resnet8/20  | CIFAR-style ResNet (6n+2 layers, 3 stages, BN)   | Fashion-MNIST                | test accuracy    |
| transformer | byte-level decoder-only LM (pre-LN, 4 blocks of width 128), 0.85 M params | Python's docs (reST sources) | validation loss  |
| lm          | GPT-2 (transformers' GPT2LMHeadModel, random init), BPE vocabulary of 8,192, 4 blocks of width 128, 1.85 M params (2.90 M untied) | the same text, tokenised | validation loss per token |

lm's tokenizer is a byte-level BPE (GPT-2's pre-tokenizer) that `tokenizers` trains here on the
training documents alone (deterministic: the same vocabulary every time), cached with the token
ids under $SKETCHSGD_CACHE (default ~/.cache/sketchsgd) by a digest of the text and the options;
documents end with an <|endoftext|> token. Its validation loss is per token; val_bits_per_byte
divides the same windows' nats by their target tokens' bytes, comparable with the byte-level
transformer's.

The text is what Debian's python3.11-doc installs: every `*.rst.txt` under its `_sources`, files in
path order, every tenth file held out for validation (whole documents, so validation text is
never trained on). Bytes are the tokens (a vocabulary of 256, no tokenizer to ship).

Data order: worker r of W takes the training items r, r+W, r+2W, … (images, or the text cut into
windows of `seq + 1` bytes), reshuffled every epoch by a generator seeded from (seed, epoch, r),
so every method sees the same examples in the same order.
"""

import glob
import gzip
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# Where Debian's packages put the data; the environment can point elsewhere (a GPU machine with
# the files staged by scripts/gpu.sh demo-prepare).
FASHION = os.environ.get("SKETCHSGD_FASHION", "/usr/share/datasets/fashion-mnist")
TEXT = os.environ.get("SKETCHSGD_TEXT", "/usr/share/doc/python3.11/html/_sources")
CACHE = os.environ.get("SKETCHSGD_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "sketchsgd"))
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def read_idx(path):
    """A gzipped IDX file as a NumPy array, its header checked."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8 or raw[0] != 0 or raw[1] != 0 or raw[2] != 8:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    body = np.frombuffer(raw, np.uint8, offset=4 + 4 * dims)
    if body.size != int(np.prod(shape)):
        raise ValueError(f"{path}: {body.size} values for shape {shape}")
    return body.reshape(shape)


class Workload:
    """One job. Subclasses set name, metric ("test_accuracy" or "val_loss") and higher_better,
    and the data attributes that items() and evaluate() use."""

    name = metric = ""
    higher_better = True

    def items(self) -> int:
        """How many training items there are (images, or text windows)."""
        raise NotImplementedError

    def batch(self, idx, device, dtype):
        """(input, target) of the items idx (a LongTensor)."""
        raise NotImplementedError

    def loss(self, out, y):
        return F.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))

    def order(self, rank: int, world: int, epoch: int, seed: int):
        """This worker's items for an epoch, in the order it trains on them."""
        mine = torch.arange(rank, self.items(), world)
        g = torch.Generator().manual_seed(seed * 1000 + epoch * 10 + rank)
        return mine[torch.randperm(len(mine), generator=g)]

    def model(self, seed: int) -> nn.Module:
        raise NotImplementedError

    def evaluate(self, model, device, dtype, limit: int = 0) -> dict:
        """The quality figures, the metric among them, over the first `limit` held-out items
        (0: all of them)."""
        raise NotImplementedError

    def describe(self, quality: float) -> str:
        raise NotImplementedError


class FashionMNIST(Workload):
    metric = "test_accuracy"

    def __init__(self, name: str, data: str = FASHION):
        if not os.path.exists(os.path.join(data, "train-images-idx3-ubyte.gz")):
            raise FileNotFoundError(f"no Fashion-MNIST in {data} (apt-get install dataset-fashion-mnist)")
        self.name = name
        self.xtr, self.ytr = self._load(data, "train")
        self.xte, self.yte = self._load(data, "t10k")
        self.n = _resnet_blocks(name) if name.startswith("resnet") else None
        if name not in ("mlp", "cnn") and self.n is None:
            raise ValueError(f"unknown Fashion-MNIST model {name!r}: mlp, cnn or resnet<6n+2>")

    @staticmethod
    def _load(data, prefix):
        x = read_idx(os.path.join(data, f"{prefix}-images-idx3-ubyte.gz")).astype(np.float32)
        y = read_idx(os.path.join(data, f"{prefix}-labels-idx1-ubyte.gz")).astype(np.int64)
        x = (x.reshape(len(x), 784) / 255.0 - 0.2860) / 0.3530  # the C++ demo's normalisation
        return torch.from_numpy(x), torch.from_numpy(y)

    def items(self):
        return len(self.xtr)

    def batch(self, idx, device, dtype):
        return self.xtr[idx].to(device, dtype), self.ytr[idx].to(device)

    def model(self, seed):
        torch.manual_seed(seed)
        if self.name == "mlp":
            return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
        if self.name == "cnn":
            return nn.Sequential(nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(),
                                 nn.MaxPool2d(2), nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
        return ResNet(self.n)

    def evaluate(self, model, device, dtype, limit=0):
        n = min(limit, len(self.xte)) if limit else len(self.xte)
        model.eval()
        right = 0
        with torch.no_grad():
            for i in range(0, n, 1000):
                j = min(i + 1000, n)
                out = model(self.xte[i:j].to(device, dtype))
                right += (out.argmax(1).cpu() == self.yte[i:j]).sum().item()
        model.train()
        return {"test_accuracy": right / n}

    def describe(self, quality):
        return f"test accuracy {100 * quality:.2f} %"


def _resnet_blocks(name):
    depth = name[len("resnet"):]
    if not depth.isdigit() or int(depth) < 8 or (int(depth) - 2) % 6:
        raise ValueError(f"{name!r}: a ResNet's depth is 6n+2 (resnet8, resnet14, resnet20, …)")
    return (int(depth) - 2) // 6


class _Basic(nn.Module):
    """Two 3x3 convolutions with batch norm and an identity (or 1x1-projected) shortcut."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.short is None else self.short(x)))


class ResNet(nn.Module):
    """He et al.'s CIFAR ResNet (6n+2 layers; 16, 32, 64 channels) on 28x28 grey images."""

    def __init__(self, n: int, width: int = 16, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers, cin = [], width
        for stage in range(3):
            cout = width << stage
            for b in range(n):
                layers.append(_Basic(cin, cout, 2 if stage and b == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x.reshape(-1, 1, 28, 28)))
        return self.fc(x.mean((2, 3)))


def documents(data: str):
    """The text's documents as bytes, (training, validation): every tenth file held out."""
    files = sorted(glob.glob(os.path.join(data, "**", "*.rst.txt"), recursive=True))
    if len(files) < 20:
        raise FileNotFoundError(f"no reStructuredText sources in {data} (apt-get install python3.11-doc)")
    train, val = [], []
    for i, path in enumerate(files):
        with open(path, "rb") as f:
            (val if i % 10 == 0 else train).append(f.read())
    return train, val


def _eval_starts(n: int, seq: int, windows: int, data: str):
    """Validation: windows spread evenly over the held-out tokens, the same in every run."""
    step = (n - seq - 1) // windows
    if step < 1:
        raise ValueError(f"{data}: too little validation text for {windows} windows of {seq}")
    return torch.arange(windows) * step


class Text(Workload):
    """Byte-level language modelling on Python's documentation sources."""

    name, metric, higher_better = "transformer", "val_loss", False

    def __init__(self, data: str = TEXT, seq: int = 64, d: int = 128, layers: int = 4, heads: int = 4,
                 eval_windows: int = 256):
        train, val = documents(data)
        self.train = torch.from_numpy(np.frombuffer(b"".join(train), np.uint8).astype(np.int64))
        self.val = torch.from_numpy(np.frombuffer(b"".join(val), np.uint8).astype(np.int64))
        self.seq, self.d, self.layers, self.heads = seq, d, layers, heads
        self.eval_starts = _eval_starts(len(self.val), seq, eval_windows, data)

    def items(self):
        return (len(self.train) - 1) // (self.seq + 1)

    def batch(self, idx, device, dtype):
        at = idx[:, None] * (self.seq + 1) + torch.arange(self.seq + 1)
        w = self.train[at]
        return w[:, :-1].to(device), w[:, 1:].to(device)

    def model(self, seed):
        torch.manual_seed(seed)
        return ByteLM(self.seq, self.d, self.layers, self.heads)

    def evaluate(self, model, device, dtype, limit=0):
        starts = self.eval_starts[:limit] if limit else self.eval_starts
        model.eval()
        total = 0.0
        with torch.no_grad():
            for i in range(0, len(starts), 64):
                at = starts[i:i + 64, None] + torch.arange(self.seq + 1)
                w = self.val[at].to(device)
                total += self.loss(model(w[:, :-1]), w[:, 1:]).item() * len(at)
        model.train()
        loss = total / len(starts)
        return {"val_loss": loss, "val_bits_per_byte": loss / math.log(2), "val_perplexity": math.exp(loss)}

    def describe(self, quality):
        return f"validation loss {quality:.4f} nats/byte ({quality / math.log(2):.3f} bits/byte)"


class _Block(nn.Module):
    """Pre-LN transformer block: causal multi-head self-attention, then a 4x GELU MLP."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ByteLM(nn.Module):
    """A GPT-style decoder over bytes: token and learned position embeddings, pre-LN blocks, a
    final LayerNorm and an untied output layer."""

    def __init__(self, seq, d, layers, heads):
        super().__init__()
        if d % heads:
            raise ValueError(f"d={d} is not a multiple of heads={heads}")
        self.tok = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256, bias=False)
        for name, p in self.named_parameters():  # GPT-2's initialisation, residual projections scaled
            if p.dim() == 2 and name != "pos":
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "fc2.weight"))
                                else 0.02)

    def forward(self, x):
        t = x.shape[1]
        h = self.tok(x) + self.pos[:t]
        # Made here, not kept as a buffer: DDP broadcasts buffers, and gloo has no bool broadcast.
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        for b in self.blocks:
            h = b(h, mask)
        return self.head(self.ln(h))


def bpe(train, val, vocab: int, cache: str = CACHE):
    """A byte-level BPE tokenizer of `vocab` tokens trained on the training documents, and both
    parts' token ids (uint16 arrays, each document followed by <|endoftext|>), from the cache when
    this text and vocabulary were tokenised before (written atomically: ranks may race)."""
    import hashlib

    import tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    if not 512 <= vocab <= 65536:
        raise ValueError(f"vocabulary of {vocab}: 512..65536 tokens")
    key = hashlib.sha256(f"{tokenizers.__version__} {vocab} {len(train)} {len(val)}".encode())
    for doc in train + val:
        key.update(hashlib.sha256(doc).digest())
    where = os.path.join(cache, f"lm-{key.hexdigest()[:16]}")
    names = [os.path.join(where, n) for n in ("tokenizer.json", "train.npy", "val.npy")]
    if all(os.path.exists(n) for n in names):
        return Tokenizer.from_file(names[0]), np.load(names[1]), np.load(names[2])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = [d.decode("utf-8", errors="replace") for d in train]
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab, min_frequency=2, show_progress=False, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    eot = tok.token_to_id("<|endoftext|>")

    def ids(docs):
        out = [np.append(np.asarray(e.ids, np.uint16), np.uint16(eot))
               for e in tok.encode_batch([d.decode("utf-8", errors="replace") for d in docs])]
        return np.concatenate(out)
    parts = [tok.to_str(), ids(train), ids(val)]
    os.makedirs(where, exist_ok=True)
    for name, part in zip(names, parts):
        tmp = f"{name}.{os.getpid()}.tmp"
        if isinstance(part, str):
            with open(tmp, "w") as f:
                f.write(part)
        else:
            with open(tmp, "wb") as f:
                np.save(f, part)
        os.replace(tmp, name)
    return tok, parts[1], parts[2]


class LM(Text):
    """A GPT-2 language model (Hugging Face transformers' classes, randomly initialised: nothing
    downloaded) over a BPE vocabulary trained here on the same documents' training part."""

    name = "lm"

    def __init__(self, data: str = TEXT, vocab: int = 8192, seq: int = 64, d: int = 128, layers: int = 4,
                 heads: int = 4, untied: bool = False, eval_windows: int = 256, cache: str = CACHE):
        if not 512 <= vocab <= 65536:
            raise ValueError(f"vocabulary of {vocab}: 512..65536 tokens")
        train, val = documents(data)
        tok, tr, va = bpe(train, val, vocab, cache)
        self.vocab, self.untied, self.eot = tok.get_vocab_size(), untied, tok.token_to_id("<|endoftext|>")
        self.train, self.val = torch.from_numpy(tr.astype(np.int64)), torch.from_numpy(va.astype(np.int64))
        # A byte-level token's string has a character per byte; <|endoftext|> stands for none.
        self.token_bytes = torch.tensor([0 if i == self.eot else len(tok.id_to_token(i)) for i in range(self.vocab)])
        self.seq, self.d, self.layers, self.heads = seq, d, layers, heads
        self.eval_starts = _eval_starts(len(self.val), seq, eval_windows, data)

    def model(self, seed):
        torch.manual_seed(seed)
        return GPT(self.vocab, self.seq, self.d, self.layers, self.heads, self.untied, self.eot)

    def evaluate(self, model, device, dtype, limit=0):
        starts = self.eval_starts[:limit] if limit else self.eval_starts
        model.eval()
        nats = tokens = nbytes = 0.0
        with torch.no_grad():
            for i in range(0, len(starts), 64):
                at = starts[i:i + 64, None] + torch.arange(self.seq + 1)
                w = self.val[at]
                y = w[:, 1:]
                nats += self.loss(model(w[:, :-1].to(device)), y.to(device)).item() * y.numel()
                tokens += y.numel()
                nbytes += self.token_bytes[y].sum().item()
        model.train()
        loss = nats / tokens
        return {"val_loss": loss, "val_bits_per_byte": nats / nbytes / math.log(2), "val_perplexity": math.exp(loss)}

    def describe(self, quality):
        return f"validation loss {quality:.4f} nats/token (perplexity {math.exp(quality):.1f})"


class GPT(nn.Module):
    """transformers' GPT2LMHeadModel as a function of token ids to logits (no dropout; the input
    embedding tied to the output layer as in GPT-2, or untied: its gradient then touches only
    the rows of the batch's tokens)."""

    def __init__(self, vocab, seq, d, layers, heads, untied, eot):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel
        if d % heads:
            raise ValueError(f"d={d} is not a multiple of heads={heads}")
        config = GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=d, n_layer=layers, n_head=heads,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=not untied,
                            bos_token_id=eot, eos_token_id=eot)
        self.gpt = GPT2LMHeadModel(config)

    @property
    def blocks(self):  # what --fsdp shards one by one
        return self.gpt.transformer.h

    def forward(self, x):
        return self.gpt(input_ids=x, use_cache=False).logits


# Per workload: the optimiser and its defaults (lr, SGD momentum), chosen once on fp32 without a
# hook and used for every method.
DEFAULTS = {
    "mlp": {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "batch": 32, "warmup": 0, "clip": 0.0,
            "schedule": "constant"},
    "cnn": {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "batch": 32, "warmup": 0, "clip": 0.0,
            "schedule": "constant"},
    # Batch norm at a constant, high rate leaves the last step's accuracy noisy: decay it.
    "resnet": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "batch": 32, "warmup": 0, "clip": 0.0,
               "schedule": "cosine"},
    "transformer": {"optimizer": "adamw", "lr": 2e-3, "momentum": 0.0, "batch": 16, "warmup": 30, "clip": 1.0,
                    "schedule": "constant"},
    "lm": {"optimizer": "adamw", "lr": 2e-3, "momentum": 0.0, "batch": 8, "warmup": 100, "clip": 1.0,
           "schedule": "cosine"},
}


def defaults(name: str) -> dict:
    return DEFAULTS["resnet" if name.startswith("resnet") else name]


def make(name: str, fashion: str = FASHION, text: str = TEXT, width: int = 128, depth: int = 4,
         vocab: int = 8192, untied: bool = False, heads: int = 4, seq: int = 64) -> Workload:
    """The workload called name (mlp, cnn, resnet8, resnet20, transformer, lm; width, depth, heads
    and seq (the window) are the language models', vocab and untied lm's)."""
    if name == "transformer":
        return Text(text, seq=seq, d=width, layers=depth, heads=heads)
    if name == "lm":
        return LM(text, vocab=vocab, seq=seq, d=width, layers=depth, heads=heads, untied=untied)
    return FashionMNIST(name, fashion)
