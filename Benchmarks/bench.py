"""Benchmark driver: peers, mounts, interleaving, medians, the markdown table.

Run through Benchmarks/run. Rows are in rows.py; peers here. Everything started is recorded in
`Bench.cleanups` and undone in reverse order in a finally block (also on SIGINT/SIGTERM).
"""
import argparse, json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rows as row_definitions  # noqa: E402
from rows import drop_caches  # noqa: E402


class Interrupted(Exception):
    pass


def log(message):
    print(message, file=sys.stderr, flush=True)


def is_mounted(path):
    path = os.path.realpath(os.path.dirname(path)) + "/" + os.path.basename(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def wait_mounted(path, process=None, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if is_mounted(path):
            # A FUSE mount answers once INIT is done: stat until it does.
            try:
                os.stat(path)
                return
            except OSError:
                pass
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"mount process exited with {process.returncode}")
        time.sleep(0.02)
    raise RuntimeError(f"{path} did not mount within {timeout}s")


def unmount(path):
    if is_mounted(path):
        subprocess.run(["fusermount3", "-u", path], check=False, stderr=subprocess.DEVNULL)
    if is_mounted(path):
        subprocess.run(["fusermount3", "-uz", path], check=False, stderr=subprocess.DEVNULL)


class Peer:
    """A way to see the source directory. `root` is where rows read; `remount()` makes it cold."""

    name = "?"
    cold_needs_remount = False
    is_access_path = False

    def __init__(self, bench):
        self.bench = bench
        self.root = None

    def start(self):
        pass

    def stop(self):
        pass

    def remount(self):
        self.stop()
        self.start()

    def access_base(self):
        """The data set's `access` folder as this peer shows it (rows.AccessPathRow)."""
        return os.path.join(self.root, "access")


class Native(Peer):
    name = "native"

    def start(self):
        self.root = self.bench.source


class FusePeer(Peer):
    """A peer run as a child process that mounts at `self.root`."""

    def __init__(self, bench):
        super().__init__(bench)
        self.process = None
        self.root = os.path.join(bench.work, self.name + "-mnt")
        os.makedirs(self.root, exist_ok=True)

    def command(self):
        raise NotImplementedError

    def start(self):
        self.prepare()
        self.process = subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, stdout=self.bench.peer_log, stderr=self.bench.peer_log,
            start_new_session=True, env=self.environment())
        wait_mounted(self.root, self.process)

    def prepare(self):
        pass

    def environment(self):
        return None  # the bench's own

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self.process = None
        unmount(self.root)


class Bindfs(FusePeer):
    name = "bindfs"

    def command(self):
        return ["bindfs", "-f", "--no-allow-other", self.bench.source, self.root]


class Rclone(FusePeer):
    name = "rclone"
    cold_needs_remount = True

    def prepare(self):
        self.cache = os.path.join(self.bench.work, "rclone-cache")
        shutil.rmtree(self.cache, ignore_errors=True)

    def command(self):
        remote = [self.bench.source]
        if self.bench.url:  # --webdav: the same server ProviderFS mounts
            remote = ["--webdav-url", self.bench.url, ":webdav:"]
        return ["rclone", "mount", "--vfs-cache-mode", "full", "--cache-dir", self.cache, "--config", "/dev/null",
                *remote, self.root]


class Davfs2(Peer):
    """davfs2 (`mount -t davfs`, Debian davfs2) of the WebDAV server, --webdav only. It runs as its
    own daemon; `umount` waits for it to write back and end. Cold: its cache removed between
    mounts."""
    name = "davfs2"
    cold_needs_remount = True

    def __init__(self, bench):
        super().__init__(bench)
        self.root = os.path.join(bench.work, self.name + "-mnt")
        os.makedirs(self.root, exist_ok=True)
        self.conf = os.path.join(bench.work, "davfs2.conf")
        with open(self.conf, "w") as f:
            # No credentials to ask for, no LOCKs (as rclone's mount), a cache a cold read fits in.
            f.write("ask_auth 0\nuse_locks 0\ncache_size 4096\n")
        # davfs2 keeps root's cache under /var/cache/davfs2, one directory per mount.
        self.cache = "/var/cache/davfs2/" + "127.0.0.1+" + self.root.strip("/").replace("/", "-") + "+root"

    def start(self):
        shutil.rmtree(self.cache, ignore_errors=True)
        subprocess.run(["mount.davfs", self.bench.url, self.root, "-o", f"conf={self.conf}"], check=True,
                       stdin=subprocess.DEVNULL, stdout=self.bench.peer_log, stderr=self.bench.peer_log, timeout=60)
        wait_mounted(self.root)

    def stop(self):
        if is_mounted(self.root):
            subprocess.run(["umount", self.root], stdout=self.bench.peer_log, stderr=self.bench.peer_log,
                           timeout=600, check=False)
        shutil.rmtree(self.cache, ignore_errors=True)


class ProviderFS(FusePeer):
    name = "providerfs"
    cold_needs_remount = True

    def prepare(self):
        self.cache = os.path.join(self.bench.work, "providerfs-cache")
        shutil.rmtree(self.cache, ignore_errors=True)

    def command(self):
        source = ["--webdav", self.bench.url] if self.bench.url else ["--source", self.bench.source]
        return [self.bench.providerfs, "mount", *source, self.root, "--cache", self.cache, "--foreground"]



class ProviderFSReadOnly(ProviderFS):
    """ProviderFS with `--read-only`: reads of materialized files may pass through to the cache file
    and use the page cache (a writable mount, the default, serves every read through the daemon,
    D-363). Added by --with-read-only; never in write rows."""
    name = "providerfs-ro"

    def prepare(self):
        self.cache = os.path.join(self.bench.work, "providerfs-ro-cache")
        shutil.rmtree(self.cache, ignore_errors=True)

    def command(self):
        return super().command() + ["--read-only"]


class ProviderFSNoPassthrough(ProviderFS):
    """ProviderFS with `--no-passthrough`: reads of materialized files go through the daemon and the
    FUSE page cache (keep_cache), as before passthrough. Added by --with-no-passthrough."""
    name = "providerfs-nopt"

    def prepare(self):
        self.cache = os.path.join(self.bench.work, "providerfs-nopt-cache")
        shutil.rmtree(self.cache, ignore_errors=True)

    def command(self):
        return super().command() + ["--no-passthrough", "--read-only"]


class ProviderFSBaseline(ProviderFS):
    """The same mount from another build (`--baseline BINARY`), for an A/B of two commits in one
    interleaved run: its column and `providerfs/providerfs-base` show what a change did."""
    name = "providerfs-base"

    def prepare(self):
        self.cache = os.path.join(self.bench.work, "providerfs-base-cache")
        shutil.rmtree(self.cache, ignore_errors=True)

    def command(self):
        command = super().command()
        command[0] = self.bench.args.baseline
        return command


class AccessPathView(Peer):
    """An access path (`MOUNTPOINT/.scoped/<token>`, issue 12) through another ProviderFS peer's
    mount: no mount of its own. Its token is granted on the data set's `access` folder, so
    `access_base()` is the same folder as the plain peers' `root/access`. Only rows that say
    `access_paths = True` measure it (the other rows' paths are not inside the grant)."""
    is_access_path = True

    def __init__(self, bench, mount):
        super().__init__(bench)
        self.mount = mount
        self.name = mount.name + "-token"
        self.base = None

    def start(self):
        folder = os.path.join(self.mount.root, "access")
        result = subprocess.run([self.bench.providerfs, "token", "grant", folder, "--json"], capture_output=True,
                                text=True, timeout=30)
        if result.returncode != 0:
            raise RuntimeError(f"token grant failed: {result.stderr.strip()}")
        self.base = json.loads(result.stdout)["accessPath"]
        self.root = self.base

    def access_base(self):
        return self.base

    def remount(self):
        raise RuntimeError("an access path is not remounted (its mount's peer is)")


class Bench:
    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.providerfs = args.providerfs
        self.work = tempfile.mkdtemp(prefix="providerfs-bench-")
        self.source = os.path.join(self.work, "source")
        os.makedirs(self.source)
        self.peer_log = open(os.path.join(self.work, "peers.log"), "ab")
        self.can_drop_caches = drop_caches()
        self.peers = []
        self.notes = []
        self.writes = False
        self.server = None
        self.url = None  # --webdav: the server's URL

    def start_server(self):
        """--webdav: `rclone serve webdav` of the source directory on 127.0.0.1 (a free port);
        every peer but native reads and writes the source through it."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.server = subprocess.Popen(
            ["rclone", "serve", "webdav", self.source, "--addr", f"127.0.0.1:{port}", "--config", "/dev/null"],
            stdin=subprocess.DEVNULL, stdout=self.peer_log, stderr=self.peer_log, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError("rclone serve webdav ended at start (peers.log)")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("rclone serve webdav did not listen within 30 s")
        self.url = f"http://127.0.0.1:{port}/"

    def stop_server(self):
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait(timeout=5)
        self.server = None

    def add_peers(self, rows):
        self.writes = any(getattr(row, "writes", False) for row in rows)
        self.peers.append(Native(self))
        if self.args.webdav:
            if shutil.which("mount.davfs"):
                self.peers.append(Davfs2(self))
            else:
                self.notes.append("davfs2 not installed (Scripts/install-deps --bench): column empty")
        elif shutil.which("bindfs"):
            self.peers.append(Bindfs(self))
        else:
            self.notes.append("bindfs not installed (Scripts/install-deps --bench): column empty")
        if shutil.which("rclone"):
            self.peers.append(Rclone(self))
        else:
            self.notes.append("rclone not installed: column empty")
        self.peers.append(ProviderFS(self))
        access_rows = any(row.access_paths for row in rows)
        # The access-path rows compare with the plain path with passthrough off too (their target
        # is about reads that reach the daemon, D-340).
        if self.args.with_no_passthrough or access_rows:
            self.peers.append(ProviderFSNoPassthrough(self))
        if self.args.with_read_only and not self.writes:
            self.peers.append(ProviderFSReadOnly(self))
        if self.args.baseline:
            self.peers.append(ProviderFSBaseline(self))
        if access_rows:
            # After the mounts they read through (peers start in order).
            for mount in [peer for peer in self.peers if isinstance(peer, ProviderFS)]:
                if not isinstance(mount, (ProviderFSNoPassthrough, ProviderFSReadOnly)):  # never pass through
                    self.peers.append(AccessPathView(self, mount))

    def cleanup(self):
        # A second Ctrl-C or SIGTERM must not cut the cleanup short (mounts left behind).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for peer in self.peers:
            try:
                peer.stop()
            except Exception as error:  # keep cleaning the others
                log(f"cleanup of {peer.name}: {error}")
        try:
            self.stop_server()
        except Exception as error:
            log(f"cleanup of the WebDAV server: {error}")
        self.peer_log.close()
        if self.args.keep:
            log(f"kept {self.work}")
        else:
            # Never delete through a mount that is still there.
            if not any(is_mounted(os.path.join(self.work, p.name + "-mnt")) for p in self.peers):
                shutil.rmtree(self.work, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description="ProviderFS benchmarks")
    parser.add_argument("--quick", action="store_true", help="fewer iterations and shorter fio runs")
    parser.add_argument("--rows", help="comma-separated row keys to run (default: all)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    parser.add_argument("--providerfs", required=True)
    parser.add_argument("--with-no-passthrough", action="store_true",
                        help="add a ProviderFS peer mounted with --no-passthrough")
    parser.add_argument("--with-read-only", action="store_true",
                        help="add a ProviderFS peer mounted with --read-only (passthrough and page cache)")
    parser.add_argument("--baseline", metavar="BINARY",
                        help="add a peer 'providerfs-base': the same mount from another providerfs binary (A/B)")
    parser.add_argument("--webdav", action="store_true",
                        help="serve the source with `rclone serve webdav` on 127.0.0.1; ProviderFS, rclone mount "
                             "and davfs2 mount that server (bindfs is left out)")
    args = parser.parse_args()

    def interrupt(signum, frame):
        raise Interrupted(f"signal {signum}")

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)

    bench = Bench(args)
    try:
        rows = row_definitions.ROWS
        if args.rows:
            wanted = set(args.rows.split(","))
            unknown = wanted - {row.key for row in rows}
            if unknown:
                log(f"unknown rows: {', '.join(sorted(unknown))} (known: {', '.join(row.key for row in rows)})")
                return 64
            rows = [row for row in rows if row.key in wanted]
        bench.add_peers(rows)
        # Peers that no selected row measures are not started (e.g. bindfs and rclone for the
        # access-path rows).
        bench.peers = [peer for peer in bench.peers if any(row.measures(peer) for row in rows)]
        log(f"== data set in {bench.source}")
        for row in rows:
            row.create_data(bench)
        subprocess.run(["sync"], check=False)
        if args.webdav:
            bench.start_server()
            log(f"== WebDAV server {bench.url} (rclone serve webdav of the data set)")
        for peer in list(bench.peers):
            try:
                peer.start()
            except Exception as error:
                log(f"   {peer.name}: cannot start: {error} (see {bench.work}/peers.log)")
                bench.notes.append(f"{peer.name} could not start: {error}")
                peer.stop()
                bench.peers.remove(peer)
        iterations = 3 if bench.quick else 5
        results = {}  # (row key, peer name) -> [values]
        for row in rows:
            log(f"== {row.title}")
            for iteration in range(row.iterations(iterations)):
                # Interleaved: every peer once per iteration, so drift hits all of them alike.
                for peer in bench.peers:
                    if not row.measures(peer):
                        continue
                    try:
                        value = row.measure(bench, peer)
                    except Interrupted:
                        raise  # a signal ends the run (and cleans up), not just this measurement
                    except Exception as error:
                        log(f"   {peer.name}: failed: {error}")
                        value = None
                    if value is not None:
                        results.setdefault((row.key, peer.name), []).append(value)
                        log(f"   {peer.name}: {row.format(value)}")
        print_table(bench, rows, results)
    except Interrupted as reason:
        log(f"interrupted ({reason}); cleaning up")
        return 130
    finally:
        bench.cleanup()
    return 0


def paired_samples(results, row, names):
    """Each peer's values of a row by iteration, where every peer has one per iteration (a failed
    measurement leaves the lists unaligned: then {}), for ratios within one iteration."""
    lists = {name: results.get((row.key, name)) for name in names}
    lists = {name: values for name, values in lists.items() if values}
    if len({len(values) for values in lists.values()}) != 1:
        return {}
    return lists


def medians_of(results, row, names):
    medians = {}
    for name in names:
        values = results.get((row.key, name))
        medians[name] = statistics.median(values) if values else None
    return medians


def remote_target(row, medians):
    """--webdav (issue 26): at least 1.5x rclone's mount on read rows, 1x on write rows."""
    factor = 1.0 if getattr(row, "writes", False) else 1.5
    target = f"≥{factor:g}× rclone"
    ours, rclone = medians.get("providerfs"), medians.get("rclone")
    if not ours or not rclone:
        return target, "–"
    better = ours / rclone if row.higher_is_better else rclone / ours
    return target, "yes" if better >= factor else "no"


def print_table(bench, rows, results):
    names = [peer.name for peer in bench.peers]
    others = [name for name in names if name != "providerfs"]
    header = ["benchmark"] + names + [f"providerfs/{name}" for name in others] + ["target", "met"]
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        medians = medians_of(results, row, names)
        cells = [row.title]
        cells += [row.format(medians[name]) if medians[name] is not None else "–" for name in names]
        for name in others:
            ours, theirs = medians.get("providerfs"), medians.get(name)
            cells.append(row.ratio(ours, theirs))
        target, met = remote_target(row, medians) if bench.url else row.target_check(medians)
        cells += [target, met]
        print("| " + " | ".join(cells) + " |")
    print()
    for row in rows:
        for line in row.notes(medians_of(results, row, names), paired_samples(results, row, names)):
            print(line)
    counts = sorted({len(values) for values in results.values()})
    print("Ratios are 'providerfs relative to the peer' with higher = better for ProviderFS "
          "(throughput: ours/theirs; times: theirs/ours). Medians of "
          f"{' or '.join(str(count) for count in counts) or 0} interleaved runs per cell "
          "(Benchmarks/README.md: which rows run three times as many).")
    if not bench.can_drop_caches:
        print("NOTE: could not drop the page cache (not root): cold rows are not cold.")
    for note in bench.notes:
        print("NOTE: " + note)


if __name__ == "__main__":
    sys.exit(main())
