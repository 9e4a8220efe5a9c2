"""Writes an OCI image archive that `ctr images import` loads: one layer
holding a static busybox (its applets as links), the entrypoint given.

    python3 oci_image.py OUT.tar NAME BUSYBOX [ENTRYPOINT...]

No registry is needed: the kubelet-style tests run pods from it.
"""
import hashlib
import io
import json
import sys
import tarfile


def blob(tar, data):
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"digest": f"sha256:{digest}", "size": len(data)}


def layer(busybox):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        for d in ("bin", "tmp", "proc", "sys", "dev", "etc"):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if d == "tmp" else 0o755
            t.addfile(info)
        with open(busybox, "rb") as f:
            data = f.read()
        info = tarfile.TarInfo("bin/busybox")
        info.size = len(data)
        info.mode = 0o755
        t.addfile(info, io.BytesIO(data))
        for applet in ("sh", "sleep", "cat", "dd", "ls"):
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type = tarfile.SYMTYPE
            info.linkname = "busybox"
            t.addfile(info)
    return out.getvalue()


def main():
    out, name, busybox, *entrypoint = sys.argv[1:]
    rootfs = layer(busybox)
    with tarfile.open(out, mode="w") as tar:
        layer_desc = blob(tar, rootfs)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint or ["/bin/sleep", "100000"], "Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
        }
        config_desc = blob(tar, json.dumps(config).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer_desc}],
        }
        manifest_desc = blob(tar, json.dumps(manifest).encode())
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    **manifest_desc,
                    "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name},
                }
            ],
        }
        for path, doc in (("oci-layout", {"imageLayoutVersion": "1.0.0"}), ("index.json", index)):
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


if __name__ == "__main__":
    main()
