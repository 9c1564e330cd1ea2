# Step 1 of regenerating tests/trainer/lightning_suite: per Lightning test file (imports already rewritten
# lightning.pytorch -> gpulayer.trainer), keep the top-level statements that execute against gpulayer.
# Usage: PYTHONPATH=<repo>:<harvest dir> python extract.py <rewritten lightning test file> <out file>
"""Per Lightning test file: keep the top-level statements that execute against gpulayer; write them out."""
import ast, sys, os, traceback
src_path, out_path = sys.argv[1], sys.argv[2]
src = open(src_path).read()
tree = ast.parse(src)
ns = {"__name__": "harvest_mod", "__file__": out_path}
kept, dropped = [], []
for node in tree.body:
    seg = ast.get_source_segment(src, node)
    if getattr(node, "decorator_list", None):
        first = min(d.lineno for d in node.decorator_list)
        lines = src.splitlines()
        seg = "\n".join(lines[first - 1:node.end_lineno])
    code = seg
    try:
        exec(compile(code, src_path, "exec"), ns)
        kept.append(code)
    except Exception as e:
        name = getattr(node, "name", type(node).__name__)
        dropped.append(f"{name}: {type(e).__name__}: {str(e)[:100]}")
with open(out_path, "w") as f:
    f.write("\n\n\n".join(kept) + "\n")
with open(out_path + ".dropped", "w") as f:
    f.write("\n".join(dropped) + "\n")
print(len(kept), "kept,", len(dropped), "dropped")
