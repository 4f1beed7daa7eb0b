"""Megatron-Core GPT with Megatron's Transformer Engine layer spec on this library, trained through
Megatron's own forward_backward_no_pipelining, in BF16 (--fp8 none) or FP8 (--fp8 hybrid,
DelayedScaling). One GPU:  python examples/integrations/megatron_gpt.py --fp8 hybrid --out r.jsonl
Tensor parallel over N GPUs:  torchrun --nproc-per-node N examples/integrations/megatron_gpt.py ...
Prints the loss of every step, checks that every TE layer is this library's and that FP8 ran, and
appends one JSON line to --out (rank 0)."""
from __future__ import annotations

import os
from functools import partial

import torch

from common import check_ours, falling, fp8_ran, parse_args, write_result


def _args(p):
    p.add_argument("--fp8", choices=("none", "hybrid"), default="none")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--micro-batch", type=int, default=4)


def _batch(vocab, seq, mbs, generator):
    """Sequences that count up modulo the vocabulary from a random start: learnable quickly."""
    start = torch.randint(0, vocab, (mbs, 1), generator=generator)
    tokens = (start + torch.arange(seq + 1)) % vocab
    return {"tokens": tokens[:, :-1].cuda(), "labels": tokens[:, 1:].cuda(),
            "position_ids": torch.arange(seq).expand(mbs, seq).cuda(),
            "loss_mask": torch.ones(mbs, seq, device="cuda")}


def main():
    args = parse_args(__doc__.splitlines()[0], _args)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.distributed.init_process_group("nccl", rank=rank, world_size=world)

    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.pipeline_parallel.schedules import forward_backward_no_pipelining
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    fp8 = None if args.fp8 == "none" else args.fp8
    config = TransformerConfig(
        num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=8,
        ffn_hidden_size=4 * args.hidden, tensor_model_parallel_size=world,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        hidden_dropout=0.0, attention_dropout=0.0, fp8=fp8, fp8_recipe="delayed",
        fp8_amax_history_len=16, fp8_amax_compute_algo="max", sequence_parallel=world > 1)
    vocab = 1024
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_with_transformer_engine_spec(),
                     vocab_size=vocab, max_sequence_length=args.seq).cuda()
    layers = check_ours(model)
    # as Megatron's own training loop does for bf16: every parameter (the learned position
    # embedding is made in fp32) in bf16, the inputs cast on the way in
    model = Float16Module(config, model)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    gen = torch.Generator().manual_seed(7)

    def loss_func(loss_mask, output_tensor):
        loss = (output_tensor.float() * loss_mask).sum() / loss_mask.sum()
        return loss, {"lm loss": loss.detach()}

    def forward_step(data_iterator, model):
        b = next(data_iterator)
        out = model(b["tokens"], b["position_ids"], None, labels=b["labels"])
        return out, partial(loss_func, b["loss_mask"])

    def batches():
        while True:
            yield _batch(vocab, args.seq, args.micro_batch, gen)

    data = batches()
    # parameters every tensor-parallel rank holds whole (the norms, the row-parallel biases) get a
    # gradient from that rank's sequence shard only under sequence parallelism; Megatron's own
    # loop sums them over the group (finalize_model_grads), and so does this one
    replicated = [p for p in model.parameters() if getattr(p, "sequence_parallel", False)]
    tp_group = parallel_state.get_tensor_model_parallel_group()
    losses = []
    for step in range(args.steps):
        optimizer.zero_grad()
        out = forward_backward_no_pipelining(
            forward_step_func=forward_step, data_iterator=data, model=model, num_microbatches=1,
            seq_length=args.seq, micro_batch_size=args.micro_batch, forward_only=False)
        if world > 1:
            for p in replicated:
                if p.grad is not None:
                    torch.distributed.all_reduce(p.grad, group=tp_group)
        optimizer.step()
        loss = out[0]["lm loss"].item()
        losses.append(round(loss, 4))
        if rank == 0:
            print(f"step {step:2d}  loss {loss:.4f}")
    ran_fp8 = fp8_ran(model)
    # the replicated parameters must still be equal on every rank after the steps
    agree = True
    if world > 1 and replicated:
        sums = torch.stack([p.detach().float().sum() for p in replicated])
        lo, hi = sums.clone(), sums.clone()
        torch.distributed.all_reduce(lo, op=torch.distributed.ReduceOp.MIN, group=tp_group)
        torch.distributed.all_reduce(hi, op=torch.distributed.ReduceOp.MAX, group=tp_group)
        agree = bool(torch.equal(lo, hi))
    ok = falling(losses) and (ran_fp8 if fp8 else True) and agree
    if rank == 0:
        import megatron.core
        write_result(args.out, {"client": "megatron-core", "client_version": megatron.core.__version__,
                                "precision": "fp8-" + fp8 if fp8 else "bf16", "tp": world,
                                "losses": losses, "loss_falls": falling(losses), "fp8_ran": ran_fp8,
                                "te_layers": sorted({c for _, c in layers}), "n_te_layers": len(layers),
                                "replicas_agree": agree, "ok": ok})
    torch.distributed.destroy_process_group()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
