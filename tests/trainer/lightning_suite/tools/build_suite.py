# Step 2: after running pytest -rA on the extracted files (results in <pytest output>), write the suite files
# with only the functions whose every parametrization passed. Usage: python build_suite.py <pytest output> <rel paths...>
"""Build tests/trainer/lightning_suite/: Lightning's own test functions that pass, imports changed only."""
import ast, os, re, sys, collections
COMMIT = "7f0c3436cd3f6ad3753125672024fc415cbcb414"
OUT = "/work/wt/lightning/tests/trainer/lightning_suite"
results = open(sys.argv[1]).read()
status = collections.defaultdict(set)   # (genfile, func) -> {"PASSED", "FAILED", ...}
for m in re.finditer(r"^(PASSED|FAILED|ERROR|SKIPPED)\S* gen/(\S+?)\.py::(\w+)", results, re.M):
    status[(m.group(2), m.group(3))].add(m.group(1))
good = {k for k, v in status.items() if v == {"PASSED"}}
os.makedirs(OUT, exist_ok=True)
sources = sys.argv[2:]
total = 0
for rel in sources:
    gen = "test_" + rel.replace("/", "_").removeprefix("test_").removesuffix(".py").replace("_test_", "_")
    src = open(f"/tmp/harvest/tests_pytorch/{rel}").read()
    src = src.replace("from tests_pytorch.helpers.runif import RunIf", "from tests.trainer.lightning_suite.runif import RunIf")
    tree = ast.parse(src)
    lines = src.splitlines()
    ns = {"__name__": "suite_build"}
    kept = []
    keep_funcs = [f for (g, f) in good if g == gen]
    if not keep_funcs:
        continue
    for node in tree.body:
        start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
        seg = "\n".join(lines[start - 1:node.end_lineno])
        if isinstance(node, (ast.Import, ast.ImportFrom)) and "tests_pytorch" in seg:
            continue
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and node.name not in keep_funcs:
            continue
        try:
            exec(compile(seg, rel, "exec"), ns)
        except Exception:
            continue
        kept.append((isinstance(node, (ast.Import, ast.ImportFrom)), seg))
    body = ""
    for i, (is_import, seg) in enumerate(kept):
        if i:
            body += "\n" if is_import and kept[i - 1][0] else "\n\n\n"
        body += seg
    kept = [seg for _, seg in kept]
    n = sum(1 for s in kept if re.search(r"^def test_", s, re.M))
    total += n
    name = "test_" + os.path.basename(rel).removeprefix("test_")
    header = (f'"""Lightning\'s own tests, copied verbatim with only the imports changed.\n\n'
              f"From github.com/Lightning-AI/pytorch-lightning, tests/tests_pytorch/{rel} at {COMMIT[:12]}\n"
              f"(the 2.6 line; compared against the installed Lightning 2.6.6). Imports: ``lightning.pytorch`` ->\n"
              f"``gpulayer.trainer``; ``tests_pytorch.helpers.runif`` -> ``tests.trainer.lightning_suite.runif``.\n"
              f"Only the functions that run on gpulayer are kept ({n} here); the others are counted in\n"
              f'tests/trainer/lightning_suite/README.md.\n"""\n\n')
    # pytest cannot collect two modules with one basename in a rootless tree: keep names unique
    open(os.path.join(OUT, name), "w").write(header + body + "\n")
    print(rel, n)
print("total", total)
