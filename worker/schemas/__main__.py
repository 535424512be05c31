"""`python -m worker.schemas`: write the published schemas again from the models."""

from pathlib import Path

from worker.schemas import write_all

for path in write_all():
    print(path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path)
