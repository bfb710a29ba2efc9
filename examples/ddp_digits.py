"""The digits CNN trained data-parallel: tt.nn.parallel.DistributedDataParallel on torch.distributed (gloo, CPU).

    torchrun --nproc_per_node=2 examples/ddp_digits.py            # 8 epochs, ~95% test accuracy
    torchrun --nproc_per_node=2 examples/ddp_digits.py --smoke    # 2 epochs on 512 images (what CI runs)

Every rank holds a replica of the model (rank 0's weights, broadcast when DDP wraps it) and takes its share of
each batch (rank r: images r, r + world, r + 2 world, ...). During backward the replicas average their gradients
in buckets, so after each backward every rank holds the gradient of the whole batch and the replicas stay equal.
Rank 0 prints the backprop trace of the first step (each bucket's all-reduce is a line), checks that step's
gradients against torch autograd on the whole batch in its own process, and reports the loss and accuracy.
The data set ships with scikit-learn; nothing is downloaded.
"""
import argparse
from typing import Any, Dict, Optional, Sequence

import torch
import torch.distributed as dist
from digits_cnn import accuracy, lenet, load_data

import torchtrace as tt
from torchtrace.nn.parallel import DistributedDataParallel


def largest_gradient_difference(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """max |.grad - torch autograd's full-batch gradient| over the parameters, for a torch twin of `model`."""
    twin = lenet(torch.nn)
    twin.load_state_dict({name: p.detach().as_subclass(torch.Tensor) for name, p in model.state_dict().items()})
    torch.nn.functional.cross_entropy(twin(x), y).backward()
    theirs = dict(twin.named_parameters())
    return max((p.grad - theirs[name].grad).abs().max().item() for name, p in model.named_parameters())


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64, help="the whole batch, over all ranks")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--limit", type=int, default=None, help="use only the first LIMIT training images")
    parser.add_argument("--bucket-cap-mb", type=float, default=0.01,
                        help="bucket size (torch's default is 25 MiB; small here so that the CNN has several)")
    parser.add_argument("--smoke", action="store_true", help="2 epochs on 512 images (for CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(epochs=2, limit=512)
        args = parser.parse_args(argv)
    torch.set_num_threads(1)

    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch_size % world:
        raise SystemExit(f"--batch-size {args.batch_size} must be a multiple of the {world} ranks")
    x_train, y_train, x_test, y_test = load_data(args.limit)
    torch.manual_seed(rank)  # different initial weights on every rank: DDP replaces them by rank 0's
    model = DistributedDataParallel(lenet(tt.nn), bucket_cap_mb=args.bucket_cap_mb)
    optimizer = tt.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = tt.nn.CrossEntropyLoss()
    if rank == 0:
        print(f"{world} ranks, {len(x_train)} training images, batches of {args.batch_size} "
              f"({args.batch_size // world} per rank), {len(model.reducer.buckets)} gradient buckets")

    losses, difference = [], None
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))  # the same on all ranks
        total, count = torch.zeros(2), 0
        for first in range(0, len(order) - args.batch_size + 1, args.batch_size):
            batch = order[first:first + args.batch_size]
            mine = batch[rank::world]
            optimizer.zero_grad()
            loss = loss_fn(model(tt.tracer(x_train[mine])), y_train[mine])
            loss.backward(show=rank == 0 and difference is None)
            if difference is None and rank == 0:
                difference = largest_gradient_difference(model.module, x_train[batch], y_train[batch])
                print(f"first step: max |DDP gradient - torch autograd full-batch gradient| = {difference:.2e}")
            elif difference is None:
                difference = 0.0
            optimizer.step()
            total += torch.tensor([loss.item() * len(mine), len(mine)])
            count += 1
        dist.all_reduce(total)  # the epoch's mean loss over every rank's images
        losses.append((total[0] / total[1]).item())
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: mean training loss {losses[-1]:.4f} ({count} steps)")

    weights = torch.cat([p.detach().as_subclass(torch.Tensor).reshape(-1) for p in model.parameters()])
    gathered = [torch.zeros_like(weights) for _ in range(world)]
    dist.all_gather(gathered, weights)
    replicas_equal = all(torch.equal(gathered[0], w) for w in gathered)
    test_accuracy = accuracy(model.module, tt.tracer(x_test), y_test)
    if rank == 0:
        print(f"replicas identical after training: {replicas_equal}")
        print(f"test accuracy: {test_accuracy:.2%}")
    dist.destroy_process_group()
    return {"losses": losses, "test_accuracy": test_accuracy, "gradient_difference": difference,
            "replicas_equal": replicas_equal}


if __name__ == "__main__":
    main()
