"""One rank of the DDP smoke test (test_torch_mount.py): a linear classifier trained over a
packfs mount with ShareSampler and the gloo backend. Prints one JSON line of what it saw."""

import json
import os
import sys

import torch
import torch.distributed as dist
import torchvision

import packfs
from packfs.torch import ShareSampler, pil_loader


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    root = os.environ["NODE_MOUNT"]
    shards = os.environ["SHARDS"].split(":")
    q = float(os.environ["Q"])
    dataset = torchvision.datasets.ImageFolder(
        root, loader=pil_loader, transform=torchvision.transforms.ToTensor()
    )
    catalog = packfs.Catalog(shards, shares=dist.get_world_size())
    sampler = ShareSampler(dataset, catalog, root, q=q, ranks_per_node=1, seed=1)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, len(dataset.classes)))
    )
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05)
    epochs = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        seen, total_loss = [], 0.0
        for images, labels in loader:
            optimiser.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimiser.step()
            total_loss += loss.item() * len(labels)
        seen = list(sampler)
        epochs.append({"samples": seen, "loss": total_loss / len(seen)})
    dist.barrier()
    dist.destroy_process_group()
    json.dump({"rank": rank, "epochs": epochs, "local": sampler.local_fraction()}, sys.stdout)


if __name__ == "__main__":
    main()
