// An fsx-style random I/O checker (issue 14): one file, a shadow copy in memory, and a seeded random
// mix of pwrite (inside, past the end making holes, at the end), pread (also past the end),
// ftruncate up and down, fsync, close-and-reopen, reads through a MAP_SHARED read-only mapping,
// and whole-file reads through a second descriptor. Every read is compared byte for byte with the
// shadow and the size with fstat after every change. A failure names the seed, the operation and
// the last operations before it, and how to replay it.

import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// What the checker does and how much.
public struct RandomIOOptions: Sendable {
    public var operations: Int
    /// The file never grows beyond this.
    public var maximumFileSize: Int
    /// The largest single write or read.
    public var maximumTransfer: Int
    /// Whether reads through mmap(MAP_SHARED, PROT_READ) are part of the mix.
    public var mappedReads: Bool
    /// How many operations a failure report lists.
    public var historyLength: Int
    /// Whether the checker fsyncs before it reads the whole file through a new descriptor. False:
    /// a new descriptor must see every write at once (POSIX). True: for a file system that shows
    /// other descriptors only what was published (by fsync or the last close); say why.
    public var fsyncBeforeOtherDescriptors: Bool

    public init(
        operations: Int = 1000, maximumFileSize: Int = 4 << 20, maximumTransfer: Int = 256 << 10,
        mappedReads: Bool = true, historyLength: Int = 24, fsyncBeforeOtherDescriptors: Bool = false
    ) {
        self.fsyncBeforeOtherDescriptors = fsyncBeforeOtherDescriptors
        self.operations = operations
        self.maximumFileSize = maximumFileSize
        self.maximumTransfer = maximumTransfer
        self.mappedReads = mappedReads
        self.historyLength = historyLength
    }
}

/// The outcome of one checker run.
public struct RandomIOReport: Sendable, CustomStringConvertible {
    public var path: String
    public var seed: UInt64
    public var operationsRun: Int
    /// Operations done, by name.
    public var counts: [String: Int]
    /// What went wrong (nil when every read matched).
    public var failure: String?
    /// The last operations, the failing one last.
    public var history: [String]
    /// What the file must hold now (the shadow), for comparing a copy elsewhere (an upload).
    public var expectedContents: [UInt8]

    public var passed: Bool { failure == nil }

    public var description: String {
        let done = counts.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        guard let failure else {
            return "random I/O on \(path), seed \(seed): \(operationsRun) operations agreed (\(done)); "
                + "final size \(expectedContents.count)"
        }
        let which = operationsRun == 0 ? "creating the file" : "operation #\(operationsRun - 1)"
        var lines = ["random I/O on \(path), seed \(seed): \(which) failed: \(failure)"]
        guard operationsRun > 0 else { return lines[0] }
        lines.append("last operations:")
        lines += history.map { "  " + $0 }
        lines.append(
            "replay: PROVIDERFS_FSX_SEED=\(seed) PROVIDERFS_FSX_RUNS=1 PROVIDERFS_FSX_OPERATIONS=\(operationsRun)")
        return lines.joined(separator: "\n")
    }
}

/// The fsx-style checker.
public enum RandomIOChecker {
    /// Creates (or truncates) `path` and runs the mix for `seed` on it. `afterEach` is called after
    /// every operation with its index (tests use it to interfere, to show that failures are found).
    /// The file is left in place, closed.
    public static func run(
        path: String, seed: UInt64, options: RandomIOOptions = RandomIOOptions(),
        afterEach: ((Int) -> Void)? = nil
    ) -> RandomIOReport {
        var checker = Run(path: path, seed: seed, options: options)
        checker.go(afterEach)
        return checker.report
    }

    private struct Failure: Error {
        var message: String
    }

    private struct Run {
        let path: String
        let options: RandomIOOptions
        var random: SeededRandom
        var shadow: [UInt8] = []
        var descriptor: Int32 = -1
        var report: RandomIOReport

        init(path: String, seed: UInt64, options: RandomIOOptions) {
            self.path = path
            self.options = options
            random = SeededRandom(seed: seed)
            report = RandomIOReport(
                path: path, seed: seed, operationsRun: 0, counts: [:], failure: nil, history: [], expectedContents: [])
        }

        mutating func below(_ bound: Int) -> Int { bound <= 0 ? 0 : Int(random.next() % UInt64(bound)) }

        mutating func note(_ index: Int, _ text: String) {
            report.history.append("#\(index) \(text)")
            if report.history.count > options.historyLength { report.history.removeFirst() }
        }

        mutating func go(_ afterEach: ((Int) -> Void)?) {
            defer {
                if descriptor >= 0 { close(descriptor) }
                descriptor = -1
                report.expectedContents = shadow
            }
            descriptor = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
            guard descriptor >= 0 else {
                report.failure = "open(O_RDWR|O_CREAT|O_TRUNC): \(Errno.current)"
                return
            }
            for index in 0..<options.operations {
                report.operationsRun = index + 1
                do {
                    try step(index)
                } catch {
                    report.failure = error.message
                    return
                }
                afterEach?(index)
            }
        }

        mutating func transferSize() -> Int {
            below(2) == 0 ? 1 + below(4096) : 1 + below(options.maximumTransfer)
        }

        mutating func step(_ index: Int) throws(Failure) {
            let roll = below(100)
            let mapped = options.mappedReads
            switch roll {
            case 0..<30: try write(index)
            case 30..<55: try read(index)
            case 55..<65: try truncate(index)
            case 65..<70:
                note(index, "fsync")
                count("fsync")
                guard retryingOnInterrupt({ fsync(descriptor) }) == 0 else {
                    throw Failure(message: "fsync: \(Errno.current)")
                }
            case 70..<76: try reopen(index)
            case 76..<90 where mapped: try mappedRead(index)
            case 76..<90: try read(index)
            default: try verifyThroughSecondDescriptor(index)
            }
        }

        mutating func count(_ name: String) { report.counts[name, default: 0] += 1 }

        mutating func write(_ index: Int) throws(Failure) {
            let size = shadow.count
            let length = min(transferSize(), options.maximumFileSize)
            let offset: Int
            switch below(100) {
            case 0..<60: offset = below(max(size, 1))
            case 60..<80: offset = size
            default: offset = below(options.maximumFileSize)
            }
            let start = min(offset, options.maximumFileSize - length)
            let bytes = seededBytes(seed: random.next(), count: length)
            let kind = start > size ? "write past the end (hole)" : "write"
            note(index, "\(kind) offset \(start) length \(length) (size \(size) → \(max(size, start + length)))")
            count(kind)
            var done = 0
            while done < length {
                let written = retryingOnInterrupt {
                    bytes.withUnsafeBytes {
                        pwrite(descriptor, $0.baseAddress! + done, length - done, off_t(start + done))
                    }
                }
                guard written > 0 else {
                    throw Failure(
                        message: "pwrite at \(start + done): \(written < 0 ? "\(Errno.current)" : "wrote 0 bytes")")
                }
                done += written
            }
            if start + length > shadow.count {
                shadow.append(contentsOf: [UInt8](repeating: 0, count: start + length - shadow.count))
            }
            shadow.withUnsafeMutableBytes { target in
                bytes.withUnsafeBytes {
                    target.baseAddress!.advanced(by: start).copyMemory(from: $0.baseAddress!, byteCount: length)
                }
            }
            try checkSize("after the write")
        }

        mutating func read(_ index: Int) throws(Failure) {
            let size = shadow.count
            let length = transferSize()
            let offset = below(100) < 10 ? size + below(4096) : below(max(size, 1))
            note(index, "read offset \(offset) length \(length) (size \(size))")
            count("read")
            let got = try readRange(descriptor, offset: offset, length: length)
            let expected = offset >= size ? 0..<0 : offset..<min(size, offset + length)
            if let difference = difference(got, shadow[expected]) {
                throw Failure(message: "pread at \(offset): \(describe(difference, at: offset))")
            }
        }

        /// nil when `got` equals `expected` (one memcmp); else where they first differ.
        func difference(_ got: [UInt8], _ expected: ArraySlice<UInt8>) -> ByteDifference? {
            let equal =
                got.count == expected.count
                && got.withUnsafeBytes { left in
                    expected.withUnsafeBytes { right in
                        got.isEmpty || memcmp(left.baseAddress!, right.baseAddress!, got.count) == 0
                    }
                }
            return equal ? nil : byteDifference(got, expected)
        }

        func describe(_ difference: ByteDifference, at offset: Int) -> String {
            "file offset \(offset + difference.offset): actual \(difference.actualByte.map { String($0) } ?? "end"), "
                + "expected \(difference.expectedByte.map { String($0) } ?? "end"); "
                + "got \(difference.actualCount) bytes, expected \(difference.expectedCount)"
        }

        /// pread until `length` bytes or the end of the file.
        func readRange(_ descriptor: Int32, offset: Int, length: Int) throws(Failure) -> [UInt8] {
            var buffer = [UInt8](repeating: 0, count: length)
            var done = 0
            while done < length {
                let got = retryingOnInterrupt {
                    buffer.withUnsafeMutableBytes {
                        pread(descriptor, $0.baseAddress! + done, length - done, off_t(offset + done))
                    }
                }
                guard got >= 0 else { throw Failure(message: "pread at \(offset + done): \(Errno.current)") }
                if got == 0 { break }
                done += got
            }
            return Array(buffer[0..<done])
        }

        mutating func truncate(_ index: Int) throws(Failure) {
            let size = shadow.count
            let newSize =
                switch below(3) {
                case 0: below(size + 1)
                case 1: min(options.maximumFileSize, size + below(options.maximumTransfer))
                default: below(options.maximumFileSize + 1)
                }
            let kind = newSize < size ? "truncate down" : "truncate up"
            note(index, "\(kind) \(size) → \(newSize)")
            count(kind)
            guard retryingOnInterrupt({ ftruncate(descriptor, off_t(newSize)) }) == 0 else {
                throw Failure(message: "ftruncate to \(newSize): \(Errno.current)")
            }
            if newSize < shadow.count {
                shadow.removeLast(shadow.count - newSize)
            } else {
                shadow.append(contentsOf: [UInt8](repeating: 0, count: newSize - shadow.count))
            }
            try checkSize("after ftruncate")
        }

        mutating func reopen(_ index: Int) throws(Failure) {
            note(index, "close and reopen (size \(shadow.count))")
            count("reopen")
            guard close(descriptor) == 0 else { throw Failure(message: "close: \(Errno.current)") }
            descriptor = retryingOnInterrupt { open(path, O_RDWR | O_CLOEXEC) }
            guard descriptor >= 0 else { throw Failure(message: "reopen: \(Errno.current)") }
            try checkSize("after reopening")
        }

        mutating func mappedRead(_ index: Int) throws(Failure) {
            let size = shadow.count
            guard size > 0 else { return try read(index) }
            let offset = below(size)
            let length = min(transferSize(), size - offset)
            note(index, "mapped read offset \(offset) length \(length) (size \(size))")
            count("mapped read")
            let mapping = mmap(nil, size, PROT_READ, MAP_SHARED, descriptor, 0)
            guard let mapping, mapping != UnsafeMutableRawPointer(bitPattern: -1) else {
                throw Failure(message: "mmap(MAP_SHARED, PROT_READ) of \(size) bytes: \(Errno.current)")
            }
            defer { munmap(mapping, size) }
            let got = [UInt8](unsafeUninitializedCapacity: length) { buffer, initialized in
                UnsafeMutableRawBufferPointer(buffer).copyMemory(
                    from: UnsafeRawBufferPointer(start: mapping + offset, count: length))
                initialized = length
            }
            if let difference = difference(got, shadow[offset..<(offset + length)]) {
                throw Failure(message: "mapped read at \(offset): \(describe(difference, at: offset))")
            }
        }

        mutating func verifyThroughSecondDescriptor(_ index: Int) throws(Failure) {
            if options.fsyncBeforeOtherDescriptors {
                note(index, "fsync, then read the whole file through a new descriptor (size \(shadow.count))")
                guard retryingOnInterrupt({ fsync(descriptor) }) == 0 else {
                    throw Failure(message: "fsync: \(Errno.current)")
                }
            } else {
                note(index, "read the whole file through a new descriptor (size \(shadow.count))")
            }
            count("whole-file read")
            let other = retryingOnInterrupt { open(path, O_RDONLY | O_CLOEXEC) }
            guard other >= 0 else { throw Failure(message: "open O_RDONLY: \(Errno.current)") }
            defer { close(other) }
            let got = try readRange(other, offset: 0, length: shadow.count + 4096)
            if let difference = difference(got, shadow[...]) {
                throw Failure(message: "whole-file read: \(describe(difference, at: 0))")
            }
        }

        func checkSize(_ when: String) throws(Failure) {
            var info = stat()
            guard fstat(descriptor, &info) == 0 else { throw Failure(message: "fstat \(when): \(Errno.current)") }
            guard Int(info.st_size) == shadow.count else {
                throw Failure(message: "fstat \(when): size \(info.st_size), expected \(shadow.count)")
            }
        }
    }
}
