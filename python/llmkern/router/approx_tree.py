"""ApproxTree: the baseline router's guess of a worker's cache, as SGLang's cache-aware router
publishes it: a radix tree over the *text* of the requests routed to that worker (not what the
worker really holds), with the least recently used leaves pruned when it grows past max_chars."""
from __future__ import annotations

import heapq
import itertools
from typing import Dict, Optional

_clock = itertools.count(1)


class _Node:
    __slots__ = ("edge", "children", "parent", "stamp")

    def __init__(self, edge: str, parent: Optional["_Node"]):
        self.edge = edge
        self.children: Dict[str, _Node] = {}
        self.parent = parent
        self.stamp = next(_clock)


def _common(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ApproxTree:
    def __init__(self, max_chars: int = 1 << 20):
        self.root = _Node("", None)
        self.size = 0             # characters stored
        self.max_chars = max_chars

    def match(self, text: str) -> int:
        """Length of the longest prefix of text inserted before (touching the path)."""
        node, i = self.root, 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                break
            k = _common(child.edge, text[i:])
            child.stamp = next(_clock)
            i += k
            if k < len(child.edge):
                break
            node = child
        return i

    def insert(self, text: str) -> None:
        node, i = self.root, 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                leaf = _Node(text[i:], node)
                node.children[text[i]] = leaf
                self.size += len(text) - i
                break
            k = _common(child.edge, text[i:])
            child.stamp = next(_clock)
            if k < len(child.edge):          # split the edge at k
                mid = _Node(child.edge[:k], node)
                node.children[text[i]] = mid
                child.edge = child.edge[k:]
                child.parent = mid
                mid.children[child.edge[0]] = child
                child = mid
            i += k
            node = child
        if self.size > self.max_chars:
            self._evict()

    def _evict(self) -> None:
        """Least recently used leaves first; a parent left without children becomes a leaf."""
        heap = []
        stack = [self.root]
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(n.children.values())
            elif n is not self.root:
                heap.append((n.stamp, id(n), n))
        heapq.heapify(heap)
        while heap and self.size > self.max_chars:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.edge[0]]
            self.size -= len(leaf.edge)
            if not parent.children and parent is not self.root:
                heapq.heappush(heap, (parent.stamp, id(parent), parent))
