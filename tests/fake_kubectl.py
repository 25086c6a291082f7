"""A stand-in for kubectl (tests/test_job_tool.py puts it on PATH as ``kubectl``).

It prints what real kubectl (1.32) prints: its stderr lines for an unreachable API server, a
missing TFJob kind, a missing object, a refused user, and the data answers ``gmeta job`` asks
for when a call fails: ``version -o json`` (``serverVersion`` only when the API server answers),
``config get-contexts -o name``, ``config view --minify -o json``, ``api-resources -o name``,
``auth can-i`` ("yes"/"no" on stdout, exit 1 for "no") and ``get --ignore-not-found -o json``
(exit 0, nothing printed, for a missing object).

Environment: FAKE_MODE down (API server unreachable) | nocrd (no TFJob kind) | notfound |
forbidden | broken (the cluster is fine, the call fails anyway, with FAKE_BROKEN's line) | ok.
FAKE_CONTEXT: what ``config current-context`` prints (unset: none set); FAKE_CONTEXTS: the
kubeconfig's contexts; FAKE_SERVER: their API server's URL; FAKE_NAMESPACE: their namespace.
FAKE_SAYS: one line that replaces every failing call's stderr (a kubectl whose wording differs).
FAKE_LOG: each call's arguments are appended there; FAKE_STDIN: ``apply``'s input; FAKE_JSON:
what ``get tfjob NAME -o json`` prints.
"""
import json
import os
import sys

REFUSED = "The connection to the server localhost:8080 was refused - did you specify the right host or port?"
KLOG = ('E1121 01:25:10.099215   19950 memcache.go:265] "Unhandled Error" err="couldn\'t get current server API '
        'group list: Get \\"http://localhost:8080/api?timeout=32s\\": dial tcp 127.0.0.1:8080: connect: '
        'connection refused"')
CLIENT = {"clientVersion": {"major": "1", "minor": "32", "gitVersion": "v1.32.4"}, "kustomizeVersion": "v5.5.0"}
SERVER = {"major": "1", "minor": "30", "gitVersion": "v1.30.2"}
BROKEN = 'error: an error on the server ("") has prevented the request from succeeding'


def _fail(*lines, out=None):
    if out is not None:
        print(out)
    said = os.environ.get("FAKE_SAYS")
    for line in [said] if said else lines:
        print(line, file=sys.stderr)
    sys.exit(1)


def _done(out=""):
    if out:
        print(out)
    sys.exit(0)


def _config(args, context, contexts, env):
    if args[1] == "current-context":
        if env.get("FAKE_CONTEXT"):
            _done(env["FAKE_CONTEXT"])
        print("error: current-context is not set", file=sys.stderr)
        sys.exit(1)
    if args[1] == "get-contexts":
        _done("\n".join(contexts))
    name = context or env.get("FAKE_CONTEXT")  # config view --minify -o json
    if not name:
        print("error: current-context must exist in order to minify", file=sys.stderr)
        sys.exit(1)
    if name not in contexts:
        print(f"error: cannot locate context {name}", file=sys.stderr)
        sys.exit(1)
    _done(json.dumps({"kind": "Config", "apiVersion": "v1", "current-context": name,
                      "clusters": [{"name": "c", "cluster": {"server": env["FAKE_SERVER"]}}],
                      "contexts": [{"name": name, "context": {"cluster": "c", "user": "u",
                                                              "namespace": env.get("FAKE_NAMESPACE", "default")}}]}))


def main(argv):
    env = os.environ
    with open(env["FAKE_LOG"], "a") as f:
        f.write(" ".join(argv) + "\n")
    args, context = list(argv), None
    while args and args[0] in ("--context", "--namespace"):
        context = args[1] if args[0] == "--context" else context
        args = args[2:]
    contexts = env.get("FAKE_CONTEXTS", "").split()
    mode = env.get("FAKE_MODE", "ok")
    if args[0] == "config":
        _config(args, context, contexts, env)
    if context is not None and context not in contexts:
        _fail(f"Error in configuration: context was not found for specified context: {context}")
    if args[0] == "apply":
        with open(env["FAKE_STDIN"], "w") as f:
            f.write(sys.stdin.read())
    if mode == "down":
        _fail(KLOG, KLOG, KLOG, REFUSED, out=json.dumps(CLIENT) if args[0] == "version" else None)
    if args[0] == "version":
        _done(json.dumps({**CLIENT, "serverVersion": SERVER}))
    if args[0] == "api-resources":
        _done("" if mode == "nocrd" else "mpijobs.kubeflow.org\npytorchjobs.kubeflow.org\ntfjobs.kubeflow.org")
    if args[:2] == ["auth", "can-i"]:
        if mode == "forbidden":
            print("no")
            sys.exit(1)
        _done("yes")
    if mode == "nocrd":
        if args[0] == "apply":
            _fail('error: resource mapping not found for name: "maml-run" namespace: "" from "STDIN": no matches '
                  'for kind "TFJob" in version "kubeflow.org/v1"', "ensure CRDs are installed first")
        if "tfjob" in args:
            _fail('error: the server doesn\'t have a resource type "tfjob"')
    if mode == "forbidden":
        _fail('Error from server (Forbidden): tfjobs.kubeflow.org "maml-run" is forbidden: User "dev" cannot get '
              'resource "tfjobs" in API group "kubeflow.org" in the namespace "default"')
    if mode == "notfound" and args[0] in ("get", "delete", "logs"):
        if "--ignore-not-found" in args:
            _done()
        what = f'pods "{args[1]}"' if args[0] == "logs" else f'{args[1]}s.kubeflow.org "{args[2]}"'
        _fail(f"Error from server (NotFound): {what} not found")
    if mode == "broken" and args[0] in ("apply", "get", "delete", "logs") and "--ignore-not-found" not in args:
        _fail(env.get("FAKE_BROKEN", BROKEN))
    if args[0] == "apply":
        _done("configmap/maml-run-config created\ntfjob.kubeflow.org/maml-run created")
    if args[:2] == ["get", "tfjob"] or args[:2] == ["get", "pod"]:
        with open(env["FAKE_JSON"]) as f:
            _done(f.read())
    if args[0] == "logs":
        _done("step 100 loss 0.51\nstep 200 loss 0.43")
    if args[:2] == ["delete", "tfjob"]:
        _done('tfjob.kubeflow.org "maml-run" deleted')
    if args[:2] == ["delete", "configmap"]:
        _done('configmap "maml-run-config" deleted')
    _done()


if __name__ == "__main__":
    main(sys.argv[1:])
