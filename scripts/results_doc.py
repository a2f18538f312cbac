"""docs/RESULTS.md holds one section per comparison script, each between markers, so a script
rewrites its own section and leaves the others (and their plots) alone."""

import os

PATH = "docs/RESULTS.md"
TITLE = "# Results: compressed training of Fashion-MNIST\n"


def write_section(name: str, text: str, path: str = PATH, order=("frontier", "ps", "ddp")) -> None:
    """Replaces the section `name` (or adds it, sections kept in `order`)."""
    sections = {}
    if os.path.exists(path):
        with open(path) as f:
            doc = f.read()
        for other in order:
            begin, end = f"<!-- section:{other} -->\n", f"<!-- end:{other} -->\n"
            if begin in doc and end in doc:
                sections[other] = doc[doc.index(begin) + len(begin):doc.index(end)]
    sections[name] = text if text.endswith("\n") else text + "\n"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(TITLE)
        for other in order:
            if other in sections:
                f.write(f"\n<!-- section:{other} -->\n{sections[other]}<!-- end:{other} -->\n")
