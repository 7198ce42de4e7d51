#!/usr/bin/env python3
"""botocore's own model of Bedrock's ConverseStream as a strict reader of a request body broca
rendered (stdin): every member is checked against the operation's input shape by botocore's
ParamValidator (an unknown member, a wrong type, a missing required member), each enum member
against its shape's values, and each blob (an image's or a document's bytes) decoded from
strict base64. Prints one JSON object: {"ok": true, "blobs": [{"path", "hex"}]} with each
blob as botocore would send it, or {"ok": false, "error": ...}."""

import base64
import json
import sys

import botocore.session
from botocore.validate import ParamValidator

shape = botocore.session.get_session().get_service_model(
    "bedrock-runtime").operation_model("ConverseStream").input_shape
blobs = []


def read(value, sh, path):
    kind = sh.type_name
    if kind == "blob":
        data = base64.b64decode(value, validate=True)
        blobs.append({"path": path, "hex": data.hex()})
        return data
    if kind == "structure":
        return {k: read(v, sh.members[k], f"{path}.{k}") if k in sh.members else v
                for k, v in value.items()}
    if kind == "list":
        return [read(v, sh.member, f"{path}[{i}]") for i, v in enumerate(value)]
    if kind == "map":
        return {k: read(v, sh.value, f"{path}.{k}") for k, v in value.items()}
    enum = getattr(sh, "enum", None)
    if enum and value not in enum:
        raise ValueError(f"{path}: {value!r} is not one of {enum}")
    return value


try:
    params = read(json.load(sys.stdin), shape, "")
    params["modelId"] = "the-model"
    report = ParamValidator().validate(params, shape)
    if report.has_errors():
        raise ValueError(report.generate_report())
    print(json.dumps({"ok": True, "blobs": blobs}))
except Exception as e:  # botocore's own refusal, reported to the test
    print(json.dumps({"ok": False, "error": str(e)}))
