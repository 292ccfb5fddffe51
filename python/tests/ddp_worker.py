"""One rank of a DDP run (test_torch_mount.py; bench/ddp.py): a linear classifier trained over a
packfs mount with ShareSampler (or DistributedSampler, Q=global) and the gloo backend. Prints
one JSON line of what it saw: per epoch, its samples, its mean loss and its node's source bytes."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torchvision

import packfs
from packfs.torch import ShareSampler, pil_loader


def source_bytes(root):
    """Bytes this node's mount has read from its images (the parallel file system's share of
    the work), once the stats file has caught up (it is rewritten every second)."""
    time.sleep(1.2)
    return packfs.status(root)[0]["counters"]["source"]["bytes"]


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    root = os.environ["NODE_MOUNT"]
    shards = os.environ["SHARDS"].split(":")
    per_node = int(os.environ.get("RANKS_PER_NODE", "1"))
    epochs_wanted = int(os.environ.get("EPOCHS", "3"))
    dataset = torchvision.datasets.ImageFolder(
        root, loader=pil_loader, transform=torchvision.transforms.ToTensor()
    )
    if os.environ["Q"] == "global":
        sampler = torch.utils.data.DistributedSampler(dataset, seed=1)
    else:
        catalog = packfs.Catalog(shards, shares=dist.get_world_size() // per_node)
        sampler = ShareSampler(
            dataset, catalog, root, q=float(os.environ["Q"]), ranks_per_node=per_node, seed=1
        )
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=int(os.environ.get("BATCH", "4")), sampler=sampler
    )
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, len(dataset.classes)))
    )
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05)
    epochs = []
    for epoch in range(epochs_wanted):
        sampler.set_epoch(epoch)
        if os.environ.get("DROP_CACHES") and rank == 0:
            # A dataset larger than the nodes' memory: nothing of the last epoch stays cached.
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3")
        dist.barrier()
        read_before = source_bytes(root)
        seen, total_loss = [], 0.0
        for images, labels in loader:
            optimiser.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimiser.step()
            total_loss += loss.item() * len(labels)
        seen = list(sampler)
        dist.barrier()  # the node's reads of this epoch are all done
        epochs.append(
            {
                "samples": seen,
                "loss": total_loss / len(seen),
                "node_source_bytes": source_bytes(root) - read_before,
            }
        )
    dist.barrier()
    dist.destroy_process_group()
    local = sampler.local_fraction() if hasattr(sampler, "local_fraction") else None
    json.dump({"rank": rank, "epochs": epochs, "local": local}, sys.stdout)


if __name__ == "__main__":
    main()
