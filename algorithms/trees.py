"""Tree shapes for tree collectives: in-order binary trees and NCCL's double binary tree."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tree:
    """One rank's place in a tree: its parent (-1 at the root) and its children."""

    root: int
    parent: int
    children: tuple[int, ...]


def inorder_tree(rank: int, size: int, relabel=lambda position: position) -> Tree:
    """A balanced binary tree over positions 0..size-1 laid out in order (each node's left subtree
    holds lower positions, its right one higher), so about half the positions are leaves.
    `relabel(position)` maps a position to the rank that sits there."""
    position_of = {relabel(p): p for p in range(size)}
    target = position_of[rank]
    low, high, parent = 0, size - 1, -1
    while True:
        middle = (low + high) // 2
        if middle == target:
            children = []
            if low <= middle - 1:
                children.append(relabel((low + middle - 1) // 2))
            if middle + 1 <= high:
                children.append(relabel((middle + 1 + high) // 2))
            root = relabel((size - 1) // 2)
            return Tree(root, -1 if parent < 0 else relabel(parent), tuple(children))
        parent = middle
        if target < middle:
            high = middle - 1
        else:
            low = middle + 1


def double_binary_tree(rank: int, size: int) -> tuple[Tree, Tree]:
    """Two trees whose interior nodes are (mostly) each other's leaves (Sanders et al. 2009; NCCL).

    The second tree is the first shifted by one rank, so every rank's links carry about the same
    load when each tree moves half of the data.
    """
    first = inorder_tree(rank, size)
    second = inorder_tree(rank, size, relabel=lambda position: (position + 1) % size)
    return first, second
