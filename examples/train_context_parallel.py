"""Train a small causal transformer a few steps with every sequence sharded across processes.

    torchrun --nproc-per-node 2 examples/train_context_parallel.py                # CPUs, Gloo
    torchrun --nproc-per-node 2 examples/train_context_parallel.py --device cuda  # GPUs, NCCL

Each process holds a zig-zag shard of every sequence (``ioattn.distributed.shard``): its tokens,
their positions and their next tokens. Everything in the model but attention works token by token,
so it runs on the shard alone; attention is ``ring_attention`` (``--variant ulysses`` for the
all-to-all). The parameters are replicated: each process's loss is its tokens' share of the mean,
and summing the gradients over the processes gives the gradient of the whole batch's loss.

Before training, the sharded model's loss and gradients are compared with the same model run on the
whole sequences in one process (plain ``flash_attn_func``), and the difference printed.
"""
import argparse
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ioattn import flash_attn_func
from ioattn.distributed import ring_attention, shard, ulysses_attention


class Block(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x, attention):
        b, n, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, dim // self.heads).unbind(2)
        x = x + self.proj(attention(q, k, v).reshape(b, n, dim))
        return x + self.mlp(self.norm2(x))


class TinyLM(torch.nn.Module):
    def __init__(self, vocab, dim, heads, layers, max_len):
        super().__init__()
        self.embed, self.pos = torch.nn.Embedding(vocab, dim), torch.nn.Embedding(max_len, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens, positions, attention):
        x = self.embed(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x, attention)
        return self.head(x)


def batch(step, args, device):
    """A batch every process draws alike: runs of counting tokens from random starts (learnable)."""
    g = torch.Generator().manual_seed(step)
    starts = torch.randint(0, args.vocab, (args.batch, 1), generator=g)
    seq = (starts + torch.arange(args.seqlen + 1)) % args.vocab
    return seq[:, :-1].to(device), seq[:, 1:].to(device)


def sharded_loss(model, tokens, targets, args):
    """This process's share of the batch's mean loss, on its shard of every sequence."""
    positions = torch.arange(args.seqlen, device=tokens.device).expand_as(tokens)
    tokens, positions, targets = (shard(t, args.layout) for t in (tokens, positions, targets))
    attend = ring_attention if args.variant == "ring" else ulysses_attention
    logits = model(tokens, positions, lambda q, k, v: attend(q, k, v, causal=True, layout=args.layout))
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum") / targets.numel() / \
        dist.get_world_size()


def whole_loss(model, tokens, targets, args):
    """The same loss in one process on the whole sequences: the reference."""
    positions = torch.arange(args.seqlen, device=tokens.device).expand_as(tokens)
    logits = model(tokens, positions, lambda q, k, v: flash_attn_func(q, k, v, causal=True))
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def all_reduce_grads(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)


def check_against_one_process(model, args, device):
    tokens, targets = batch(0, args, device)
    model.zero_grad()
    loss = sharded_loss(model, tokens, targets, args)
    loss.backward()
    all_reduce_grads(model)
    dist.all_reduce(loss := loss.detach())
    sharded = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    whole = whole_loss(model, tokens, targets, args)
    whole.backward()
    grad_diff = max((a - p.grad).abs().max().item() for a, p in zip(sharded, model.parameters()))
    return abs(loss.item() - whole.item()), grad_diff


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--variant", choices=("ring", "ulysses"), default="ring")
    ap.add_argument("--layout", choices=("contiguous", "zigzag"), default="zigzag")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seqlen", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=64)
    args = ap.parse_args()

    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(args.device)
    if args.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())  # one process a GPU (one host)
        device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)  # the same initial parameters in every process
    model = TinyLM(args.vocab, dim=64, heads=4, layers=2, max_len=args.seqlen).to(device)

    loss_diff, grad_diff = check_against_one_process(model, args, device)
    if rank == 0:
        print(f"{world} processes, {args.variant} attention, {args.layout} shards of {args.seqlen} tokens on "
              f"{args.device}: against one process, loss differs by {loss_diff:.2e}, gradients by {grad_diff:.2e}")

    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(args.steps):
        tokens, targets = batch(step + 1, args, device)
        opt.zero_grad()
        loss = sharded_loss(model, tokens, targets, args)
        loss.backward()
        all_reduce_grads(model)
        opt.step()
        dist.all_reduce(loss := loss.detach())
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {loss.item():.4f}  (uniform guess: {math.log(args.vocab):.4f})")
    dist.barrier()  # every process done before any tears the group down (Gloo can abort otherwise)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
