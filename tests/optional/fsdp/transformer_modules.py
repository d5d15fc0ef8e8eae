"""Transformers as users bring them, for `trainer=fsdp`'s default units: none of them written for this template.

`SequenceModel` (a LightningModule of a user's own) trains any network that maps token ids `[B, T]` to logits
(`[B, T, vocab]` for a language model, `[B, classes]` for a classifier) on `TokenData`'s sequences. The networks:
- `TorchTransformerLM`: `nn.Transformer` (its `nn.MultiheadAttention` reads `out_proj.weight` without calling
  `out_proj`, the case that broke a `Linear`-per-unit sharding);
- `EncoderClassifier`: `nn.TransformerEncoder`, pooled, then a `Linear` head;
- `GPT`: a stack of blocks of its own (`F.scaled_dot_product_attention`), its output layer's weight tied to its
  token embedding with `tie=true`, as GPT-2's.
`TiedLanguageModel` is that GPT written into its LightningModule, as most hand-written GPTs are: `embed`, `blocks`,
`head` are the module's own attributes, and the output layer's weight, tied to the embedding's, is shared by two of
its networks. Their YAML files are in `TRANSFORMER_CONF` (`model/transformer.yaml`, `model/tied_lm.yaml`,
`data/tokens.yaml`).
"""

from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

# Their YAML files, to put on Hydra's search path.
TRANSFORMER_CONF = Path(__file__).parent / "conf"
STRIDES = 3  # a sequence counts up by 1, 2 or 3 (mod the vocabulary): its class, and what predicts its next token


def stride_sequences(count: int, length: int, vocab: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """`count` sequences of `length` tokens, each counting up from a random start by its stride; and the strides."""
    starts = torch.randint(vocab, (count, 1), generator=generator)
    strides = torch.randint(STRIDES, (count,), generator=generator)
    return (starts + (strides[:, None] + 1) * torch.arange(length)) % vocab, strides


class TokenData(L.LightningDataModule):
    """`task=next_token`: (tokens, the tokens after them) pairs; `task=classify`: (tokens, stride class)."""

    def __init__(
        self,
        task: str = "next_token",
        vocab: int = 32,
        length: int = 16,
        batch_size: int = 4,
        train_sequences: int = 32,
    ) -> None:
        super().__init__()
        self.task, self.vocab, self.length, self.batch_size = task, vocab, length, batch_size
        self.train_sequences = train_sequences

    def setup(self, stage: str) -> None:
        generator = torch.Generator().manual_seed(0)
        self.splits = {}
        for split, count in (("train", self.train_sequences), ("val", 16), ("test", 16)):
            sequences, strides = stride_sequences(count, self.length + 1, self.vocab, generator)
            targets = sequences[:, 1:] if self.task == "next_token" else strides
            self.splits[split] = TensorDataset(sequences[:, :-1], targets)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.splits["train"], batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.splits["val"], batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.splits["test"], batch_size=self.batch_size)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.splits["test"], batch_size=self.batch_size)


class SequenceSteps(L.LightningModule):
    """The steps, loss, metrics and optimizer of a model whose `forward` maps token ids to logits."""

    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr

    def _loss(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        inputs, targets = batch
        logits = self(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        accuracy = (logits.argmax(-1) == targets).float().mean()
        self.log(f"{stage}/loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        self.log(f"{stage}/acc", accuracy, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._loss(batch, "train")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._loss(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._loss(batch, "test")

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self(batch[0]).argmax(-1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class SequenceModel(SequenceSteps):
    def __init__(self, network: nn.Module, lr: float = 3e-3) -> None:
        super().__init__(lr)
        self.network = network

    def forward(self, tokens: Tensor) -> Tensor:
        return self.network(tokens)


def causal_mask(length: int) -> Tensor:
    return nn.Transformer.generate_square_subsequent_mask(length)


class TorchTransformerLM(nn.Module):
    def __init__(self, vocab: int = 32, width: int = 128, heads: int = 4, layers: int = 2, length: int = 16) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, width), nn.Embedding(length, width)
        self.transformer = nn.Transformer(
            width, heads, layers, layers, dim_feedforward=2 * width, dropout=0.0, batch_first=True
        )
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: Tensor) -> Tensor:
        length = tokens.shape[1]
        embedded = self.embed(tokens) + self.position(torch.arange(length, device=tokens.device))
        mask = causal_mask(length).to(tokens.device)
        return self.head(self.transformer(embedded, embedded, src_mask=mask, tgt_mask=mask, memory_mask=mask))


class EncoderClassifier(nn.Module):
    def __init__(self, vocab: int = 32, width: int = 128, heads: int = 4, layers: int = 2, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


class Block(nn.Module):
    """A pre-norm GPT block: causal self-attention, then an MLP, each around a residual."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(
        self, vocab: int = 32, width: int = 128, heads: int = 4, layers: int = 2, length: int = 16, tie: bool = False
    ) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, width), nn.Embedding(length, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        nn.init.normal_(self.embed.weight, std=0.02)  # GPT-2's, which keeps a tied output layer's logits small
        if tie:
            self.head.weight = self.embed.weight

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class TiedLanguageModel(SequenceSteps):
    """`GPT(tie=True)`'s layers as attributes of the LightningModule itself: its networks `embed` and `head` share
    the output layer's weight."""

    def __init__(
        self, vocab: int = 32, width: int = 128, heads: int = 4, layers: int = 2, length: int = 16, lr: float = 3e-3
    ) -> None:
        super().__init__(lr)
        gpt = GPT(vocab, width, heads, layers, length, tie=True)
        self.embed, self.position, self.blocks, self.norm, self.head = (
            gpt.embed,
            gpt.position,
            gpt.blocks,
            gpt.norm,
            gpt.head,
        )

    forward = GPT.forward  # the same layers under the same names
