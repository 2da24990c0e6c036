"""Print the bytes an image adds over its base: uncompressed, then as pushed (gzipped).

Usage: layers.py MANIFESTS OCI_DIR. MANIFESTS holds two lines, the stored manifests of the base
and of the image (`buildah inspect --format '{{.Manifest}}'`); OCI_DIR is the image pushed to an
OCI layout. An image built FROM the base starts with the base's layers, so the layers it adds
are those after the base's count, in either manifest.
"""

import json
import sys
from pathlib import Path


def main() -> None:
    base, image = (json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines())
    oci = Path(sys.argv[2])
    index = json.loads((oci / "index.json").read_text())
    digest = index["manifests"][0]["digest"]
    pushed = json.loads((oci / "blobs" / digest.replace(":", "/")).read_text())
    count = len(base["layers"])
    if [layer["digest"] for layer in image["layers"][:count]] != [
        layer["digest"] for layer in base["layers"]
    ]:
        sys.exit("layers.py: the image does not start with the base's layers")
    raw = sum(layer["size"] for layer in image["layers"][count:])
    packed = sum(layer["size"] for layer in pushed["layers"][count:])
    print(raw, packed)


if __name__ == "__main__":
    main()
