"""The house's shape beyond what import-linter's contracts say: no module imports itself back
through others, type-only imports included (an import cycle makes a room hard to move or test alone)."""

from __future__ import annotations

import grimp

PACKAGES = ("foundation", "sim", "nets", "buffer", "learner", "aggregator", "sampler", "deploy_npu", "fleet")


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in graph.find_modules_directly_imported_by(module):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_back_through_others():
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False)
    assert len(graph.modules) > 100  # the whole product was read
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for module in ("a", "b", "c", "d"):
        graph.add_module(module)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    graph.add_import(importer="c", imported="a")
    graph.add_import(importer="c", imported="d")
    assert _cycles(graph) == [["a", "b", "c"]]
