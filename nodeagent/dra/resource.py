"""The Kubernetes API the DRA driver speaks, named once: resource.k8s.io/v1 (GA since
Kubernetes 1.34), for the objects it writes (`apiVersion`) and the paths it reads them at."""

from __future__ import annotations

GROUP = "resource.k8s.io"
API_VERSION = f"{GROUP}/v1"  # an object's apiVersion
API_PATH = f"/apis/{API_VERSION}"  # the REST paths' prefix
