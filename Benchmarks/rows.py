"""Benchmark rows. To add one: write a Row subclass with `create_data` and `measure`, append it to
ROWS. `measure(bench, peer)` returns one number (or None to skip that peer); `higher_is_better`
decides how ratios are computed; `target` (optional) is checked against the medians.
"""
import contextlib, os, shutil, signal, statistics, subprocess, sys, tarfile, time


def log(message):
    print(message, file=sys.stderr, flush=True)



def drop_caches(what=3):
    """Drops the kernel page cache so the next read comes from the disk/daemon (root only).
    `what` as /proc/sys/vm/drop_caches takes it: 1 pages, 2 dentries and inodes, 3 both."""
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write(f"{what}\n")
        return True
    except OSError:
        return False

MiB = 1 << 20


def read_all(path, block=1 << 20):
    total = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            chunk = f.read(block)
            if not chunk:
                return total
            total += len(chunk)


class Row:
    key = "?"
    title = "?"
    unit = ""
    higher_is_better = True
    # Whether the row measures access-path peers (bench.AccessPathView); their paths exist only
    # inside the granted `access` folder.
    access_paths = False

    def measures(self, peer):
        return not peer.is_access_path

    def notes(self, medians, paired):
        """Lines printed under the table (e.g. ratios the ratio columns do not show). `paired`:
        each peer's values by iteration (bench.paired_samples)."""
        return []

    def iterations(self, default):
        return default

    def create_data(self, bench):
        pass

    def measure(self, bench, peer):
        raise NotImplementedError

    def format(self, value):
        if value is None:
            return "–"
        return f"{value:,.0f} {self.unit}" if value >= 100 else f"{value:.2f} {self.unit}"

    def ratio(self, ours, theirs):
        if not ours or not theirs:
            return "–"
        return f"{ours / theirs:.2f}×" if self.higher_is_better else f"{theirs / ours:.2f}×"

    def target_check(self, medians):
        return "", ""


def throughput(path, size):
    start = time.perf_counter()
    count = read_all(path)
    elapsed = time.perf_counter() - start
    assert count == size, f"read {count} bytes of {size}"
    return size / MiB / elapsed


class ColdSequential(Row):
    key = "cold"
    title = "cold sequential read 512 MiB"
    unit = "MiB/s"
    size = 512 * MiB

    def create_data(self, bench):
        path = os.path.join(bench.source, "seq.bin")
        with open(path, "wb") as f:
            for _ in range(self.size // (8 * MiB)):
                f.write(os.urandom(8 * MiB))

    def measure(self, bench, peer):
        if peer.cold_needs_remount:
            peer.remount()
        drop_caches()
        return throughput(os.path.join(peer.root, "seq.bin"), self.size)

    def target_check(self, medians):
        ours, rclone, bindfs = medians.get("providerfs"), medians.get("rclone"), medians.get("bindfs")
        ok = ours is not None and (rclone is None or ours >= 2 * rclone) and (bindfs is None or ours >= 0.8 * bindfs)
        return "≥2× rclone, ≥0.8× bindfs", "yes" if ok else "no"


class WarmReread(Row):
    key = "warm"
    title = "warm re-read 512 MiB"
    unit = "MiB/s"
    size = 512 * MiB

    def measure(self, bench, peer):
        path = os.path.join(peer.root, "seq.bin")
        read_all(path)  # make sure it is complete and cached
        return throughput(path, self.size)

    def target_check(self, medians):
        ours, native = medians.get("providerfs"), medians.get("native")
        ok = ours is not None and native is not None and ours >= 0.9 * native
        return "≥0.9× native", "yes" if ok else "no"


SMALL_FILES = 2000


class SmallFilesData(Row):
    def create_data(self, bench):
        directory = os.path.join(bench.source, "small")
        if os.path.isdir(directory):
            return
        os.makedirs(directory)
        for index in range(SMALL_FILES):
            with open(os.path.join(directory, f"f{index:05}.txt"), "wb") as f:
                f.write(os.urandom(100 + index % 3000))


class StatFiles(SmallFilesData):
    """Each peer's kernel caches as it sets them: bindfs and rclone cache names and attributes for
    1 s, ProviderFS for 1 s or, for items whose changes its provider pushes (a local source: inotify),
    for `trackedTimeout` (10 s) with every change invalidated at once (D-228). The sleep lets 1 s
    caches expire, as for a tool that stats the same files again a moment later."""
    key = "stat"
    title = f"stat of {SMALL_FILES:,} files, 1.1 s after the last pass"
    unit = "files/s"

    def iterations(self, default):
        # A pass is ~60 ms, and on a shared 2-vCPU VM single passes of every peer swing by 2-3x
        # (scheduling stalls of ~0.4 ms hit a few percent of the stats): three samples gave a
        # median that flipped between 0.7x and 1.6x from one run to the next. Three times as many
        # cost ~30 s more and settle it.
        return default * 3

    def measure(self, bench, peer):
        directory = os.path.join(peer.root, "small")
        names = [f"f{index:05}.txt" for index in range(SMALL_FILES)]
        time.sleep(1.1)  # let 1 s attribute/entry caches expire
        start = time.perf_counter()
        for name in names:
            os.stat(os.path.join(directory, name))
        return SMALL_FILES / (time.perf_counter() - start)

    def target_check(self, medians):
        ours, bindfs = medians.get("providerfs"), medians.get("bindfs")
        ok = ours is not None and bindfs is not None and ours >= bindfs
        return "≥ bindfs", "yes" if ok else "no"


class StatFilesUncached(SmallFilesData):
    key = "statlookup"
    title = f"stat of {SMALL_FILES:,} files, every stat a LOOKUP"
    unit = "files/s"

    def iterations(self, default):
        return default * 3  # as StatFiles: single passes swing on this kind of VM

    def measure(self, bench, peer):
        directory = os.path.join(peer.root, "small")
        names = [f"f{index:05}.txt" for index in range(SMALL_FILES)]
        os.stat(directory)
        # Names and inodes forgotten (FUSE sends FORGET): every stat is a LOOKUP that reaches the
        # daemon, whatever its timeouts. Also drops the source's own.
        if not drop_caches(2):
            return None
        os.stat(directory)  # the directory is looked up again outside the timed loop
        start = time.perf_counter()
        for name in names:
            os.stat(os.path.join(directory, name))
        return SMALL_FILES / (time.perf_counter() - start)


def open_and_read_small_files(peer):
    directory = os.path.join(peer.root, "small")
    start = time.perf_counter()
    for index in range(SMALL_FILES):
        with open(os.path.join(directory, f"f{index:05}.txt"), "rb") as f:
            f.read()
    return SMALL_FILES / (time.perf_counter() - start)


class OpenReadFiles(SmallFilesData):
    """Every file read once, untimed, before a peer's first pass: the caching peers' first pass
    downloads (that is the next row), and one such sample among the warm ones pulled their median
    down. A pass is ~0.3 s and single passes swing 2-4x on a shared VM: three times as many."""
    key = "smallread"
    title = f"open+read of {SMALL_FILES:,} small files, warm"
    unit = "files/s"

    def __init__(self):
        self.warmed = set()

    def iterations(self, default):
        return default * 3

    def measure(self, bench, peer):
        if id(peer) not in self.warmed:
            open_and_read_small_files(peer)
            self.warmed.add(id(peer))
        return open_and_read_small_files(peer)


class OpenReadFilesFirst(SmallFilesData):
    """The first read of each file: the caching peers are remounted with an empty cache (each
    file is downloaded), and every peer's page cache, dentries and inodes are dropped."""
    key = "smallcold"
    title = f"open+read of {SMALL_FILES:,} small files, first read"
    unit = "files/s"

    def measure(self, bench, peer):
        if peer.cold_needs_remount:
            peer.remount()
        drop_caches()
        return open_and_read_small_files(peer)


class FioRandomWarm(Row):
    key = "fio"
    title = "fio random 4k reads, warm"
    unit = "IOPS"

    def measure(self, bench, peer):
        path = os.path.join(peer.root, "seq.bin")
        read_all(path)
        runtime = 3 if bench.quick else 5
        result = subprocess.run(
            ["fio", "--name=rand", f"--filename={path}", "--rw=randread", "--bs=4k", "--ioengine=psync",
             f"--runtime={runtime}", "--time_based", "--readonly", "--invalidate=0", "--output-format=terse",
             "--terse-version=3"], capture_output=True, text=True, check=True)
        fields = result.stdout.strip().split("\n")[-1].split(";")
        return float(fields[7])  # read IOPS in terse v3


class TimeToFirstByte(Row):
    key = "ttfb"
    title = "time to first byte, 1 GiB placeholder"
    unit = "ms"
    higher_is_better = False

    def create_data(self, bench):
        with open(os.path.join(bench.source, "huge.bin"), "wb") as f:
            f.truncate(1 << 30)

    def measure(self, bench, peer):
        if peer.cold_needs_remount:
            peer.remount()
        drop_caches()
        path = os.path.join(peer.root, "huge.bin")
        # The placeholder is listed first (as a user would see it in `ls`); the time is open + the
        # first byte, which is what waits for the download.
        os.stat(path)
        start = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            assert len(f.read(1)) == 1
        return (time.perf_counter() - start) * 1000

    def target_check(self, medians):
        ours = medians.get("providerfs")
        return "≤20 ms", "yes" if ours is not None and ours <= 20 else "no"


# ---------------------------------------------------------------------------------------------
# Access paths (issue 12): reads through `MOUNTPOINT/.scoped/<token>` against the plain path of the
# same mount, in the same run. Peers: `providerfs` (the plain path as mounted: passthrough and the
# page cache for materialized files), `providerfs-nopt` (the plain path of a `--no-passthrough`
# mount: the daemon and the page cache), `providerfs-token` (an access path through the
# `providerfs` mount: every open, read and lookup reaches the daemon and its token check, direct
# I/O, D-306), and `native` for scale. With `--baseline`, `providerfs-base` and
# `providerfs-base-token` too. Everything is materialized (read once, untimed) before the first pass.

ACCESS_FILES = 1000
ACCESS_BULK = 256 * MiB


class AccessPathRow(Row):
    access_paths = True
    # The plain path it is compared with, for the target; (name, ratio) pairs for the notes.
    target_peer = "providerfs"
    target_ratio = 0.9

    def __init__(self):
        self.warmed = set()

    def measures(self, peer):
        return peer.name == "native" or peer.name.startswith("providerfs")

    def create_data(self, bench):
        directory = os.path.join(bench.source, "access", "small")
        if not os.path.isdir(directory):
            os.makedirs(directory)
            for index in range(ACCESS_FILES):
                with open(os.path.join(directory, f"f{index:05}.txt"), "wb") as f:
                    f.write(os.urandom(100 + (index * 7) % 3000))
        bulk = os.path.join(bench.source, "access", "bulk.bin")
        if not os.path.exists(bulk):
            with open(bulk, "wb") as f:
                for _ in range(ACCESS_BULK // (8 * MiB)):
                    f.write(os.urandom(8 * MiB))

    def warm(self, peer):
        """Everything read once through this peer before its first pass (downloads stay out)."""
        if peer.name in self.warmed:
            return
        base = peer.access_base()
        for index in range(ACCESS_FILES):
            read_all(os.path.join(base, "small", f"f{index:05}.txt"))
        read_all(os.path.join(base, "bulk.bin"))
        self.warmed.add(peer.name)

    def iterations(self, default):
        return default * 3  # passes are short and swing on a shared VM, as for smallread

    def measure(self, bench, peer):
        self.warm(peer)
        return self.pass_(peer.access_base())

    def ratio_of(self, medians, token, plain):
        ours, theirs = medians.get(token), medians.get(plain)
        if not ours or not theirs:
            return None
        return ours / theirs if self.higher_is_better else theirs / ours

    def target_check(self, medians):
        ratio = self.ratio_of(medians, "providerfs-token", self.target_peer)
        target = f"token ≥{self.target_ratio}× {self.target_peer}"
        if ratio is None:
            return target, "–"
        return f"{target}: {ratio:.2f}×", "yes" if ratio >= self.target_ratio else "no"

    def paired_ratio(self, paired, ours, theirs):
        """The median of the ratios within each iteration (both measured moments apart, so the
        machine's drift between iterations cancels), or None."""
        if ours not in paired or theirs not in paired:
            return None
        ratios = [self.ratio_of({"a": a, "b": b}, "a", "b") for a, b in zip(paired[ours], paired[theirs])]
        ratios = [ratio for ratio in ratios if ratio is not None]
        return statistics.median(ratios) if ratios else None

    def notes(self, medians, paired):
        lines = []

        def cell(ours, theirs):
            ratio = self.ratio_of(medians, ours, theirs)
            within = self.paired_ratio(paired, ours, theirs)
            if ratio is None:
                return None
            text = f"{ratio:.2f}× {theirs}"
            return text + (f" (median of per-iteration ratios {within:.2f}×)" if within is not None else "")

        for token in [name for name in medians if name.endswith("-token")]:
            mount = token[: -len("-token")]
            cells = [cell(token, plain) for plain in dict.fromkeys((mount, "providerfs-nopt")) if plain in medians]
            cells = [text for text in cells if text]
            if cells:
                lines.append(f"- {self.key}: access path {token} relative to the plain path: " + "; ".join(cells))
        if "providerfs-base-token" in medians:
            text = cell("providerfs-token", "providerfs-base-token")
            if text:
                lines.append(f"- {self.key}: A/B providerfs-token relative to {text}")
        return lines


class AccessPathOpenRead(AccessPathRow):
    """Opens as an app does them: open, read the whole small file, close. Through an access path
    each is a LOOKUP of `<token>` and of the name (zero entry timeouts), an open that takes a use,
    a GETATTR when needed and the reads, each checking the token."""
    key = "tokenopen"
    title = f"open+read+close of {ACCESS_FILES:,} small files, warm"
    unit = "files/s"
    target_ratio = 0.9

    def pass_(self, base):
        directory = os.path.join(base, "small")
        start = time.perf_counter()
        for index in range(ACCESS_FILES):
            with open(os.path.join(directory, f"f{index:05}.txt"), "rb", buffering=0) as f:
                f.read(4096)
        return ACCESS_FILES / (time.perf_counter() - start)


class AccessPathOpenClose(AccessPathRow):
    """open + close only, no read."""
    key = "tokenopenonly"
    title = f"open+close of {ACCESS_FILES:,} small files, warm"
    unit = "files/s"
    target_ratio = 0.9

    def pass_(self, base):
        directory = os.path.join(base, "small")
        start = time.perf_counter()
        for index in range(ACCESS_FILES):
            os.close(os.open(os.path.join(directory, f"f{index:05}.txt"), os.O_RDONLY))
        return ACCESS_FILES / (time.perf_counter() - start)


class AccessPathBulk(AccessPathRow):
    """A materialized 256 MiB file read sequentially in 1 MiB reads, each path as it is: the plain
    path's re-reads come from the page cache (and with passthrough from the cache file's), the
    access path's all reach the daemon (direct I/O by design, D-306). Informational: the target is
    the next row's (D-340)."""
    key = "tokenbulk"
    title = f"sequential read of a materialized {ACCESS_BULK // MiB} MiB file, page cache as each path sets it"
    unit = "MiB/s"

    def pass_(self, base):
        return throughput(os.path.join(base, "bulk.bin"), ACCESS_BULK)

    def target_check(self, medians):
        return "(informational, D-340)", ""


class AccessPathBulkDaemon(AccessPathBulk):
    """As tokenbulk, but the plain path's page cache for the file is dropped first
    (posix_fadvise DONTNEED through that path), so the plain path's reads reach the daemon too:
    the comparison the issue's "within 5%, even without passthrough" is about (D-340):
    providerfs-token against providerfs-nopt. (With passthrough the kernel reads the cache file,
    whose own page cache stays: that column is not a daemon read.)"""
    key = "tokenbulkdaemon"
    title = f"sequential read of a materialized {ACCESS_BULK // MiB} MiB file, every read reaching the daemon"
    target_peer = "providerfs-nopt"
    target_ratio = 0.95

    def pass_(self, base):
        path = os.path.join(base, "bulk.bin")
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)
        return throughput(path, ACCESS_BULK)

    def measures(self, peer):
        # native would read the disk after DONTNEED: not the same kind of read.
        return peer.name.startswith("providerfs")

    def target_check(self, medians):
        return AccessPathRow.target_check(self, medians)


# ---------------------------------------------------------------------------------------------
# Writes (issue 14): every writable peer writes into a fresh folder of its own under `writes/` of
# what it shows (native: the source directory itself; bindfs, rclone and ProviderFS: their mounts
# of it). A row is marked `writes = True`; bench.py then mounts ProviderFS writable
# (PROVIDERFS_WRITES=1, D-350) and rclone with writes on. After a pass the folder is removed
# through the source directory, untimed (a pass's files never pile up, and no peer's removal
# speed is measured). ProviderFS's numbers include publishing (fsync, the last close); its
# uploads to the source are asynchronous (write-back), as rclone's are.

UNTAR_FILES = 3000


class WriteRow(Row):
    writes = True

    def __init__(self):
        self.passes = 0

    def measures(self, peer):
        return not peer.is_access_path and getattr(peer, "writable", True)

    def folder(self, bench, peer):
        self.passes += 1
        relative = os.path.join("writes", f"{peer.name}-{self.key}-{self.passes}")
        os.makedirs(os.path.join(bench.source, "writes"), exist_ok=True)
        return relative

    def cleanup(self, bench, relative):
        shutil.rmtree(os.path.join(bench.source, relative), ignore_errors=True)

    @contextlib.contextmanager
    def pass_directory(self, bench, peer):
        """A fresh folder of this pass on `peer` (yielded as its path there), removed through the
        source directory afterwards (untimed)."""
        relative = self.folder(bench, peer)
        directory = os.path.join(peer.root, relative)
        os.makedirs(directory)
        try:
            yield directory
        finally:
            self.cleanup(bench, relative)


class SequentialWrite(WriteRow):
    key = "seqwrite"
    title = "sequential write 512 MiB, with fsync"
    unit = "MiB/s"
    size = 512 * MiB

    def measure(self, bench, peer):
        chunk = os.urandom(MiB)
        with self.pass_directory(bench, peer) as directory:
            path = os.path.join(directory, "seq.bin")
            start = time.perf_counter()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for _ in range(self.size // MiB):
                    os.write(fd, chunk)
                os.fsync(fd)
            finally:
                os.close(fd)
            elapsed = time.perf_counter() - start
            assert os.stat(path).st_size == self.size
            return self.size / MiB / elapsed

    def target_check(self, medians):
        ours, bindfs = medians.get("providerfs"), medians.get("bindfs")
        ok = ours is not None and bindfs is not None and ours >= 0.7 * bindfs
        return "≥0.7× bindfs", "yes" if ok else "no"


class Untar(WriteRow):
    key = "untar"
    title = f"untar of a source tree ({UNTAR_FILES:,} small files)"
    unit = "files/s"

    def create_data(self, bench):
        tree = os.path.join(bench.work, "tree")
        self.tarball = os.path.join(bench.work, "tree.tar")
        if os.path.exists(self.tarball):
            return
        for index in range(UNTAR_FILES):
            directory = os.path.join(tree, f"module{index % 60:02}", f"part{index % 7}")
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, f"file{index:05}.swift"), "wb") as f:
                f.write(os.urandom(200 + (index * 37) % 8000))
        subprocess.run(["tar", "cf", self.tarball, "-C", tree, "."], check=True)
        shutil.rmtree(tree)

    def measure(self, bench, peer):
        with self.pass_directory(bench, peer) as directory:
            start = time.perf_counter()
            subprocess.run(["tar", "xf", self.tarball, "-C", directory], check=True)
            elapsed = time.perf_counter() - start
            if getattr(bench, "url", None) and peer.name != "native":
                # --webdav (issue 26): also the time until the server holds every file whole.
                at_source = os.path.join(bench.source, os.path.relpath(directory, peer.root))
                self.wait_until_held(at_source, start, peer.name)
            return UNTAR_FILES / elapsed

    def wait_until_held(self, at_source, start, name, timeout=900):
        expected = {}
        with tarfile.open(self.tarball) as archive:
            for member in archive.getmembers():
                if member.isfile():
                    expected[os.path.normpath(member.name)] = member.size
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            held = 0
            for relative, size in expected.items():
                try:
                    if os.stat(os.path.join(at_source, relative)).st_size == size:
                        held += 1
                except OSError:
                    pass
            if held == len(expected):
                self.held.setdefault(name, []).append(time.perf_counter() - start)
                return
            time.sleep(0.2)
        log(f"   {name}: the server did not hold all {len(expected)} files within {timeout} s")

    held = {}

    def notes(self, medians, paired):
        if not self.held:
            return []
        cells = ", ".join(f"{name} {statistics.median(values):.1f} s" for name, values in sorted(self.held.items()))
        return [f"untar: time from the start of `tar x` until the server holds every file (median): {cells}"]

    def target_check(self, medians):
        ours, bindfs = medians.get("providerfs"), medians.get("bindfs")
        ok = ours is not None and bindfs is not None and ours >= 0.5 * bindfs
        return "≥0.5× bindfs", "yes" if ok else "no"


def tree_signature(root):
    """Relative path -> (kind, link target | size and sha256 | mode) of everything under `root`,
    links not followed: what a correct extraction must reproduce."""
    import hashlib, stat as stat_module
    signature = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            relative = os.path.relpath(path, root)
            if stat_module.S_ISLNK(info.st_mode):
                signature[relative] = ("link", os.readlink(path))
            elif stat_module.S_ISDIR(info.st_mode):
                signature[relative] = ("dir", stat_module.S_IMODE(info.st_mode))
            else:
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                signature[relative] = ("file", stat_module.S_IMODE(info.st_mode), info.st_size, digest)
    return signature


class UntarReal(WriteRow):
    """tar x of /usr/include and /usr/share/man (about 33,000 entries, thousands of symbolic links:
    tar's placeholder check of st_ino runs on every one), then a correctness check: tar must exit
    0 and the extracted tree must equal a plain extraction (kinds, link targets, modes, bytes);
    a peer that extracts wrongly gets no value, and the log says what differs (issue 23)."""
    key = "untar-real"
    title = "untar of /usr/include + /usr/share/man, checked"
    unit = "entries/s"

    def iterations(self, default):
        return min(default, 3)

    def create_data(self, bench):
        self.tarball = os.path.join(bench.work, "usr-tree.tar")
        self.reference = os.path.join(bench.work, "usr-tree-reference")
        if os.path.exists(self.tarball):
            return
        subprocess.run(["tar", "cf", self.tarball, "-C", "/", "usr/include", "usr/share/man"], check=True)
        listing = subprocess.run(["tar", "tf", self.tarball], check=True, capture_output=True).stdout
        self.entries = listing.count(b"\n")
        os.makedirs(self.reference)
        subprocess.run(["tar", "xf", self.tarball, "-C", self.reference], check=True)
        self.expected = tree_signature(self.reference)

    def measure(self, bench, peer):
        with self.pass_directory(bench, peer) as directory:
            start = time.perf_counter()
            result = subprocess.run(["tar", "xf", self.tarball, "-C", directory], capture_output=True)
            elapsed = time.perf_counter() - start
            if result.returncode != 0:
                raise RuntimeError(f"tar exited {result.returncode}: {result.stderr.decode()[:300]}")
            actual = tree_signature(directory)
            wrong = sorted(k for k in set(actual) | set(self.expected) if actual.get(k) != self.expected.get(k))
            if wrong:
                raise RuntimeError(f"{len(wrong)} entries differ from a plain extraction, first {wrong[:3]}")
            return self.entries / elapsed

    def target_check(self, medians):
        ours, bindfs = medians.get("providerfs"), medians.get("bindfs")
        ok = ours is not None and bindfs is not None and ours >= 0.8 * bindfs
        return "≥0.8× bindfs", "yes" if ok else "no"


class SaveLoop(WriteRow):
    """An editor's save, 200 times: write a temporary file (20 KB), fsync it, rename it over the
    document (issue 23). The document must end with the last save's bytes."""
    key = "save-loop"
    title = "editor save: write + fsync + rename over, ×200"
    unit = "saves/s"
    saves = 200

    def measure(self, bench, peer):
        with self.pass_directory(bench, peer) as directory:
            temporary, document = os.path.join(directory, "doc.tmp"), os.path.join(directory, "doc.txt")
            start = time.perf_counter()
            for index in range(self.saves):
                data = index.to_bytes(4, "big") * 5000
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    os.write(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.rename(temporary, document)
            elapsed = time.perf_counter() - start
            with open(document, "rb") as f:
                if f.read() != data:
                    raise RuntimeError("the document does not hold the last save")
            return self.saves / elapsed

    def target_check(self, medians):
        ours, bindfs = medians.get("providerfs"), medians.get("bindfs")
        ok = ours is not None and bindfs is not None and ours >= 0.5 * bindfs
        return "≥0.5× bindfs", "yes" if ok else "no"


class GitClone(WriteRow):
    """git clone (local, --no-hardlinks) of a repository of 2,000 files in 100 commits onto the
    peer, then git fsck and a diff of the work tree against the origin's (issue 23)."""
    key = "git-clone"
    title = "git clone of a 2,000-file, 100-commit repository, checked"
    unit = "s"
    higher_is_better = False

    def create_data(self, bench):
        self.origin = os.path.join(bench.work, "origin.git")
        self.checkout = os.path.join(bench.work, "origin-tree")
        if os.path.exists(self.origin):
            return
        environment = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@b", GIT_COMMITTER_NAME="b",
                           GIT_COMMITTER_EMAIL="b@b")
        subprocess.run(["git", "init", "-q", self.checkout], check=True)
        for commit in range(100):
            for index in range(20):
                path = os.path.join(self.checkout, f"dir{commit % 10}", f"file{commit:03}-{index:02}.c")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(os.urandom(100 + (commit * 37 + index * 101) % 4000))
            subprocess.run(["git", "-C", self.checkout, "add", "-A"], check=True, env=environment)
            subprocess.run(["git", "-C", self.checkout, "commit", "-qm", f"commit {commit}"], check=True,
                           env=environment)
        subprocess.run(["git", "clone", "-q", "--bare", self.checkout, self.origin], check=True)

    def measure(self, bench, peer):
        with self.pass_directory(bench, peer) as directory:
            clone = os.path.join(directory, "clone")
            start = time.perf_counter()
            subprocess.run(["git", "clone", "-q", "--no-hardlinks", self.origin, clone], check=True)
            elapsed = time.perf_counter() - start
            subprocess.run(["git", "-C", clone, "fsck", "--no-progress"], check=True, stdout=subprocess.DEVNULL)
            subprocess.run(["diff", "-r", "-q", "-x", ".git", self.checkout, clone], check=True,
                           stdout=subprocess.DEVNULL)
            return elapsed

    def target_check(self, medians):
        ours, bindfs = medians.get("providerfs"), medians.get("bindfs")
        ok = ours is not None and bindfs is not None and ours <= bindfs / 0.8
        return "≥0.8× bindfs", "yes" if ok else "no"


class SQLiteInserts(WriteRow):
    """sqlite3 (Python's module, the same library) creates a database on the peer and inserts rows
    one transaction each, in its default rollback-journal mode: every commit creates, writes,
    fsyncs and deletes the journal and rewrites pages of the database file, which is what an app
    keeping its data on the mount does. Then 20,000 rows in one transaction."""
    key = "sqlite"
    title = "sqlite3: 300 single-row transactions, then 20,000 rows in one"
    unit = "tx/s"

    def measure(self, bench, peer):
        import sqlite3
        with self.pass_directory(bench, peer) as directory:
            path = os.path.join(directory, "bench.db")
            connection = sqlite3.connect(path, isolation_level=None)
            try:
                connection.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, value BLOB)")
                start = time.perf_counter()
                for index in range(300):
                    connection.execute("BEGIN")
                    connection.execute("INSERT INTO t (name, value) VALUES (?, ?)", (f"row {index}", os.urandom(100)))
                    connection.execute("COMMIT")
                elapsed = time.perf_counter() - start
                connection.execute("BEGIN")
                connection.executemany(
                    "INSERT INTO t (name, value) VALUES (?, ?)", ((f"bulk {i}", b"x" * 100) for i in range(20000)))
                connection.execute("COMMIT")
                count = connection.execute("SELECT count(*) FROM t").fetchone()[0]
                assert count == 20300, count
            finally:
                connection.close()
            return 300 / elapsed


# ---------------------------------------------------------------------------------------------
# Cache limits (issue 27, D-432): files larger in all than the cache's size limit read one after
# the other through a mount limited to it, while a sampler adds up the blocks of the cache
# directory every 20 ms. The value is the peak over the limit (lower is better): ProviderFS checks
# as downloads store bytes, rclone's `--vfs-cache-max-size` on its poll interval (1 minute by
# default). Each peer mounts a limited instance of its own for the row (the shared peers have no
# limit), then unmounts it.

class CacheLimitPeak(Row):
    key = "cache-limit"
    title = "peak cache size reading 8 files of limit/2 under a size limit"
    unit = "× limit"
    higher_is_better = False
    files = 8

    def limit(self, bench):
        return (64 if bench.quick else 256) * MiB

    def iterations(self, default):
        return 1

    def measures(self, peer):
        return peer.name in ("providerfs", "rclone")

    def create_data(self, bench):
        directory = os.path.join(bench.source, "limit")
        os.makedirs(directory, exist_ok=True)
        size = self.limit(bench) // 2
        for index in range(self.files):
            with open(os.path.join(directory, f"f{index}.bin"), "wb") as f:
                for _ in range(size // (8 * MiB)):
                    f.write(os.urandom(8 * MiB))

    def format(self, value):
        return "–" if value is None else f"{value:.2f} {self.unit}"

    def ratio(self, ours, theirs):
        if not ours or not theirs:
            return "–"
        return f"{theirs / ours:.2f}×"

    @staticmethod
    def allocated(root):
        total = 0
        for directory, _, names in os.walk(root):
            for name in names:
                try:
                    total += os.lstat(os.path.join(directory, name)).st_blocks * 512
                except OSError:
                    pass
        return total

    def measure(self, bench, peer):
        import threading
        from bench import unmount, wait_mounted
        limit = self.limit(bench)
        root = os.path.join(bench.work, f"limit-{peer.name}-mnt")
        cache = os.path.join(bench.work, f"limit-{peer.name}-cache")
        shutil.rmtree(cache, ignore_errors=True)
        os.makedirs(root, exist_ok=True)
        if peer.name == "rclone":
            command = ["rclone", "mount", "--vfs-cache-mode", "full", "--vfs-cache-max-size", str(limit),
                       "--cache-dir", cache, "--config", "/dev/null", bench.source, root]
        else:
            command = [bench.providerfs, "mount", "--source", bench.source, root, "--cache", cache, "--foreground",
                       "--cache-max-size", str(limit)]
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=bench.peer_log, stderr=bench.peer_log,
                                   start_new_session=True)
        peak = [0]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], self.allocated(cache))
                done.wait(0.02)

        sampler = threading.Thread(target=sample)
        try:
            wait_mounted(root, process)
            baseline = self.allocated(cache)  # metadata store and logs before any content
            sampler.start()
            size = limit // 2
            for index in range(self.files):
                assert read_all(os.path.join(root, "limit", f"f{index}.bin")) == size
            time.sleep(0.5)  # let a check that the last bytes started finish, then sample once more
            done.set()
            sampler.join()
            peak[0] = max(peak[0], self.allocated(cache))
            return (peak[0] - baseline) / limit
        finally:
            done.set()
            if sampler.is_alive():
                sampler.join()
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5)
            unmount(root)
            shutil.rmtree(cache, ignore_errors=True)

    def target_check(self, medians):
        ours = medians.get("providerfs")
        # One file of limit/2 may be open (being read) beyond the limit.
        return "≤1.5× limit", "yes" if ours is not None and ours <= 1.5 else "no"


# ---------------------------------------------------------------------------------------------
# Cache control at scale (issue 27, D-431, D-445): a folder of 10,000 files of 1 KiB on a mount of
# its own (ProviderFS only: no peer has these commands). `evict-10k`: every file read once (untimed),
# then `providerfs evict FOLDER` until it returns. `pin-10k`: a fresh cache, `providerfs pin FOLDER`
# and `status --json` polled (every 200 ms: each poll walks the pinned tree) until every file is
# downloaded, nothing read through the mount. The value is the wall time; the daemon's CPU time
# (utime + stime from /proc) over the same span is printed under the table.

class CacheControlAtScale(Row):
    unit = "s"
    higher_is_better = False
    files = 10_000

    def __init__(self):
        self.cpu = []

    def iterations(self, default):
        return 1

    def measures(self, peer):
        return peer.name == "providerfs"

    def create_data(self, bench):
        directory = os.path.join(bench.source, "many")
        if os.path.isdir(directory) and len(os.listdir(directory)) == self.files:
            return
        os.makedirs(directory, exist_ok=True)
        block = os.urandom(1024)
        for index in range(self.files):
            with open(os.path.join(directory, f"f{index:05d}.txt"), "wb") as f:
                f.write(block)

    def format(self, value):
        return "–" if value is None else f"{value:.2f} {self.unit}"

    def notes(self, medians, paired):
        if not self.cpu:
            return []
        return [f"`{self.key}`: daemon CPU {statistics.median(self.cpu):.2f} s (median of {len(self.cpu)}), "
                f"wall {medians.get('providerfs') or 0:.2f} s, for {self.files:,} files"]

    @staticmethod
    def daemon_cpu(pid):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    @contextlib.contextmanager
    def own_mount(self, bench):
        from bench import unmount, wait_mounted
        root = os.path.join(bench.work, f"{self.key}-mnt")
        cache = os.path.join(bench.work, f"{self.key}-cache")
        shutil.rmtree(cache, ignore_errors=True)
        os.makedirs(root, exist_ok=True)
        process = subprocess.Popen(
            [bench.providerfs, "mount", "--source", bench.source, root, "--cache", cache, "--foreground"],
            stdin=subprocess.DEVNULL, stdout=bench.peer_log, stderr=bench.peer_log, start_new_session=True)
        try:
            wait_mounted(root, process)
            yield root, process.pid
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5)
            unmount(root)
            shutil.rmtree(cache, ignore_errors=True)

    def command(self, bench, *arguments):
        subprocess.run([bench.providerfs, *arguments], check=True, stdout=subprocess.DEVNULL, stderr=bench.peer_log)

    def downloaded(self, bench, root):
        import json
        result = subprocess.run([bench.providerfs, "status", root, "--json"], check=True, capture_output=True, text=True)
        pins = json.loads(result.stdout)["cache"].get("pins") or {}
        return pins.get("downloadedFiles", 0)


class EvictManyFiles(CacheControlAtScale):
    key = "evict-10k"
    title = "providerfs evict of a folder of 10,000 downloaded files"

    def measure(self, bench, peer):
        with self.own_mount(bench) as (root, pid):
            folder = os.path.join(root, "many")
            for name in sorted(os.listdir(folder)):
                assert read_all(os.path.join(folder, name)) == 1024
            cpu = self.daemon_cpu(pid)
            start = time.perf_counter()
            self.command(bench, "evict", folder)
            elapsed = time.perf_counter() - start
            self.cpu.append(self.daemon_cpu(pid) - cpu)
            return elapsed


class PinManyFiles(CacheControlAtScale):
    key = "pin-10k"
    title = "providerfs pin of a folder of 10,000 files until all are downloaded"

    def measure(self, bench, peer):
        with self.own_mount(bench) as (root, pid):
            folder = os.path.join(root, "many")
            cpu = self.daemon_cpu(pid)
            start = time.perf_counter()
            self.command(bench, "pin", folder)
            deadline = start + 600
            while self.downloaded(bench, root) < self.files:
                assert time.perf_counter() < deadline, "the pinned folder was not downloaded within 600 s"
                time.sleep(0.2)
            elapsed = time.perf_counter() - start
            self.cpu.append(self.daemon_cpu(pid) - cpu)
            return elapsed


# ---------------------------------------------------------------------------------------------
# Big directories (issue 28 item 4): one directory of N files (`bigdir/flat`) and a tree of N files
# in 100 directories (`bigdir/tree`); N = 100,000, 20,000 with --quick. Every pass is cold: the
# caching peers are remounted with an empty cache and every peer's dentries, inodes and pages are
# dropped (root), so the listing reaches each daemon (and the source's disk). `bigdir-ls` also times
# a second `ls -f` right after the cold one (warm: each peer's kernel caches as it sets them),
# printed under the table.

BIGDIR_DIRECTORIES = 100


def bigdir_count(bench):
    return 20_000 if bench.quick else 100_000


class BigDirData(Row):
    higher_is_better = False
    unit = "s"

    def create_data(self, bench):
        count = bigdir_count(bench)
        root = os.path.join(bench.source, "bigdir")
        marker = os.path.join(bench.work, f"bigdir-{count}.done")
        if os.path.exists(marker):
            return
        flat = os.path.join(root, "flat")
        os.makedirs(flat, exist_ok=True)
        for index in range(count):
            with open(os.path.join(flat, f"file-{index:06}.txt"), "wb") as f:
                f.write(b"x" * (index % 100))
        per_directory = count // BIGDIR_DIRECTORIES
        for directory in range(BIGDIR_DIRECTORIES):
            path = os.path.join(root, "tree", f"dir-{directory:03}")
            os.makedirs(path, exist_ok=True)
            for index in range(per_directory):
                with open(os.path.join(path, f"file-{index:05}.c"), "wb") as f:
                    f.write(b"y" * (index % 50))
        open(marker, "w").close()

    def iterations(self, default):
        return default

    def format(self, value):
        if value is None:
            return "–"
        return f"{value * 1000:,.1f} ms" if value < 1 else f"{value:.2f} s"

    @staticmethod
    def cold(peer):
        if peer.cold_needs_remount:
            peer.remount()
        drop_caches()

    @staticmethod
    def timed(command):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start

    def target_check(self, medians):
        ours, bindfs = medians.get("providerfs"), medians.get("bindfs")
        ok = ours is not None and bindfs is not None and ours <= self.target_factor * bindfs
        return self.target_text, "yes" if ok else "no"


class BigDirList(BigDirData):
    key = "bigdir-ls"
    title = "`ls -f` of one directory of N files, cold (warm under the table)"
    target_factor = 2
    target_text = "cold ≤ 2× bindfs; warm ≤ bindfs"

    def __init__(self):
        self.warm = {}

    def measure(self, bench, peer):
        directory = os.path.join(peer.root, "bigdir", "flat")
        self.cold(peer)
        cold = self.timed(["ls", "-f", directory])
        self.warm.setdefault(peer.name, []).append(self.timed(["ls", "-f", directory]))
        return cold

    def target_check(self, medians):
        text, met = super().target_check(medians)
        ours, bindfs = self.warm.get("providerfs"), self.warm.get("bindfs")
        if met == "yes" and not (ours and bindfs and statistics.median(ours) <= statistics.median(bindfs)):
            met = "no (warm)"
        return text, met

    def notes(self, medians, paired):
        if not self.warm:
            return []
        warm = {name: statistics.median(values) for name, values in self.warm.items()}
        cells = [f"{name} {self.format(value)}" for name, value in warm.items()]
        line = f"- {self.key} warm (a second `ls -f` right after the cold one): " + ", ".join(cells)
        ours = warm.get("providerfs")
        for name in ("bindfs", "providerfs-base"):
            if ours and warm.get(name):
                line += f"; providerfs/{name} {warm[name] / ours:.2f}×"
        return [line]


class BigDirLongList(BigDirData):
    key = "bigdir-lsl"
    title = "`ls -l` of one directory of N files, cold"
    target_factor = 1
    target_text = "≤ bindfs"

    def measure(self, bench, peer):
        self.cold(peer)
        return self.timed(["ls", "-l", os.path.join(peer.root, "bigdir", "flat")])


class BigDirFind(BigDirData):
    key = "bigdir-find"
    title = f"`find` of a tree of N files in {BIGDIR_DIRECTORIES} directories, cold"
    target_factor = 2
    target_text = "≤ 2× bindfs"

    def measure(self, bench, peer):
        self.cold(peer)
        return self.timed(["find", os.path.join(peer.root, "bigdir", "tree")])


class BigDirFirstEntry(BigDirData):
    """opendir and the first readdir (one getdents64 of glibc's 32 KiB buffer) of a cold directory
    of N files: how long a caller waits before it sees anything. A listing that streams answers
    this before the whole directory was read from the provider."""
    key = "bigdir-first"
    title = "first entry of a cold listing of N files"
    target_factor = 1
    target_text = "(streaming: ≪ bigdir-ls)"

    def measure(self, bench, peer):
        directory = os.path.join(peer.root, "bigdir", "flat")
        self.cold(peer)
        start = time.perf_counter()
        with os.scandir(directory) as entries:
            next(entries)
            elapsed = time.perf_counter() - start
        return elapsed

    def target_check(self, medians):
        return self.target_text, ""


ROWS = [
    ColdSequential(), WarmReread(), StatFiles(), StatFilesUncached(), OpenReadFiles(), FioRandomWarm(),
    TimeToFirstByte(), OpenReadFilesFirst(), AccessPathOpenRead(), AccessPathOpenClose(), AccessPathBulk(),
    AccessPathBulkDaemon(), SequentialWrite(), Untar(), UntarReal(), SaveLoop(), GitClone(),
    SQLiteInserts(), CacheLimitPeak(), EvictManyFiles(), PinManyFiles(), BigDirList(), BigDirLongList(),
    BigDirFind(), BigDirFirstEntry()
]
