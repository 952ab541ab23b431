// Faults through the control socket (docs/CONTROL.md): the `faultAdd`, `faultList` and
// `faultClear` requests — their arguments, checked strictly, and the daemon's answers over the
// mount's stored FaultPlan. The CLI on top is FaultCommand.swift.

import ControlWire
import Foundation
import ProviderCache
import ProviderFaults
import ProviderModel
import SystemSupport
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

/// The arguments of `faultAdd`: `{"path", "fault", "at", "errno", "durationMilliseconds",
/// "bytesPerSecond", "times", "metadata", "on"}` ("on": "download", the default, or "upload").
struct FaultRequest: Sendable, Equatable {
    /// Relative to the mount root.
    var path: String
    var fault: Fault
    /// Downloads (uploads, for an upload rule); 0: until cleared; nil: the fault's default
    /// (offline and metadata faults hold until cleared, the others one download or upload).
    var times: Int?
    var metadata: Bool
    /// Which calls the rule strikes (`--on`).
    var on: FaultCall = .download

    static let kinds = ["failAt", "stall", "truncate", "corrupt", "changeVersion", "slow", "offline"]
    /// Limits a request is checked against (a larger value is a mistake, not a test).
    static let maximumOffset: Int64 = 1 << 50
    static let maximumDurationMilliseconds: Int64 = 86_400_000
    static let maximumBytesPerSecond: Int64 = 1 << 40
    static let maximumTimes: Int64 = 1_000_000

    /// What times the rule gets.
    var faultTimes: FaultTimes {
        switch times {
        case 0?: .untilCleared
        case let count?: .downloads(count)
        case nil: fault == .offline || metadata ? .untilCleared : .downloads(1)
        }
    }

    var kind: String {
        switch fault {
        case .failAfter: "failAt"
        case .stall: "stall"
        case .truncate: "truncate"
        case .corrupt: "corrupt"
        case .changeVersion: "changeVersion"
        case .slow: "slow"
        case .offline: "offline"
        }
    }

    var arguments: [String: Any] {
        var arguments: [String: Any] = ["path": path, "fault": kind]
        switch fault {
        case .failAfter(let offset, let errno):
            arguments["at"] = offset
            arguments["errno"] = Errno(errno).name
        case .stall(let offset, let duration):
            arguments["at"] = offset
            if let duration { arguments["durationMilliseconds"] = Int64((duration.seconds * 1000).rounded()) }
        case .truncate(let offset), .corrupt(let offset), .changeVersion(let offset):
            arguments["at"] = offset
        case .slow(let rate):
            arguments["bytesPerSecond"] = rate
        case .offline:
            break
        }
        if let times { arguments["times"] = times }
        if metadata { arguments["metadata"] = true }
        if on != .download { arguments["on"] = on.rawValue }
        return arguments
    }

    /// Checks every argument: unknown or misplaced fields, types, ranges, errno names.
    static func parse(_ arguments: [String: Any]) -> Result<FaultRequest, ControlError> {
        func invalid(_ message: String) -> Result<FaultRequest, ControlError> {
            .failure(ControlError(.invalidArguments, message))
        }
        guard let kind = arguments["fault"] as? String else {
            return invalid("\"faultAdd\" needs a string argument \"fault\": one of \(kinds.joined(separator: ", "))")
        }
        guard kinds.contains(kind) else {
            return invalid("unknown fault '\(kind)'; known: \(kinds.joined(separator: ", "))")
        }
        var on = FaultCall.download
        if let raw = arguments["on"] {
            guard let name = raw as? String, let call = FaultCall(rawValue: name) else {
                return invalid("\"on\" must be \"download\" or \"upload\"")
            }
            on = call
        }
        if on == .upload && !["failAt", "stall", "offline"].contains(kind) {
            return invalid("an upload fault is failAt, stall or offline, not \(kind)")
        }
        var allowed: Set<String> = ["path", "fault", "times", "metadata", "on"]
        switch kind {
        case "failAt": allowed.formUnion(["at", "errno"])
        case "stall": allowed.formUnion(["at", "durationMilliseconds"])
        case "slow": allowed.insert("bytesPerSecond")
        case "offline": break
        default: allowed.insert("at")
        }
        if let unknown = arguments.keys.sorted().first(where: { !allowed.contains($0) }) {
            return invalid("\"\(unknown)\" is not an argument of a \(kind) fault")
        }
        guard let rawPath = arguments["path"] as? String else {
            return invalid("\"faultAdd\" needs a string argument \"path\"")
        }
        guard let path = ControlRequest.normalizedRelativePath(rawPath) else {
            return invalid("\"path\" must be relative to the mount root, without '..'")
        }
        func integer(_ name: String, in range: ClosedRange<Int64>) -> Result<Int64?, ControlError> {
            guard let raw = arguments[name] else { return .success(nil) }
            guard let value = ControlProtocol.integer(raw) else {
                return .failure(
                    ControlError(
                        .invalidArguments,
                        "\"\(name)\" must be an integer between \(range.lowerBound) and \(range.upperBound)"))
            }
            guard range.contains(value) else {
                return .failure(
                    ControlError(
                        .invalidArguments,
                        "\"\(name)\" must be between \(range.lowerBound) and \(range.upperBound) (got \(value))"))
            }
            return .success(value)
        }
        let at: Int64?
        let times: Int64?
        let duration: Int64?
        let rate: Int64?
        switch (
            integer("at", in: 0...maximumOffset), integer("times", in: 0...maximumTimes),
            integer("durationMilliseconds", in: 1...maximumDurationMilliseconds),
            integer("bytesPerSecond", in: 1...maximumBytesPerSecond)
        ) {
        case (.success(let a), .success(let t), .success(let d), .success(let r)):
            (at, times, duration, rate) = (a, t, d, r)
        case (.failure(let error), _, _, _), (_, .failure(let error), _, _), (_, _, .failure(let error), _),
            (_, _, _, .failure(let error)):
            return .failure(error)
        }
        var metadata = false
        if let raw = arguments["metadata"] {
            guard let flag = boolean(raw) else { return invalid("\"metadata\" must be true or false") }
            metadata = flag
        }
        let fault: Fault
        switch kind {
        case "failAt":
            guard let at else { return invalid("a failAt fault needs \"at\" (the byte where it fails)") }
            var code = EIO
            if let raw = arguments["errno"] {
                guard let name = raw as? String, let number = errnoNumber(name) else {
                    return invalid("\"errno\" must be an errno name such as EIO, ECONNRESET or EACCES")
                }
                code = number
            }
            fault = .failAfter(offset: at, errno: code)
        case "stall": fault = .stall(offset: at ?? 0, duration: duration.map { .milliseconds($0) })
        case "truncate":
            guard let at else { return invalid("a truncate fault needs \"at\" (the byte where the stream ends)") }
            fault = .truncate(offset: at)
        case "corrupt": fault = .corrupt(offset: at ?? 0)
        case "changeVersion":
            guard let at else { return invalid("a changeVersion fault needs \"at\" (the byte where it happens)") }
            fault = .changeVersion(offset: at)
        case "slow":
            guard let rate else { return invalid("a slow fault needs \"bytesPerSecond\"") }
            fault = .slow(bytesPerSecond: rate)
        default: fault = .offline
        }
        if metadata && !fault.appliesToMetadata {
            return invalid("\"metadata\" applies to failAt, stall and offline faults only")
        }
        if on == .upload && metadata {
            return invalid("\"metadata\" does not apply to upload faults")
        }
        if on == .upload, case .stall(let offset, _) = fault, offset != 0 {
            return invalid("\"at\" does not apply to an upload stall (it stalls before the first byte)")
        }
        return .success(
            FaultRequest(path: path, fault: fault, times: times.map { Int($0) }, metadata: metadata, on: on))
    }

    /// `faultClear`: `{"path": P}` or `{"all": true}`; nil means all.
    static func parseClear(_ arguments: [String: Any]) -> Result<String?, ControlError> {
        if let unknown = arguments.keys.sorted().first(where: { $0 != "path" && $0 != "all" }) {
            return .failure(ControlError(.invalidArguments, "\"\(unknown)\" is not an argument of faultClear"))
        }
        switch (arguments["path"], arguments["all"].flatMap(boolean)) {
        case (let raw?, nil):
            guard let path = (raw as? String).flatMap(ControlRequest.normalizedRelativePath) else {
                return .failure(
                    ControlError(.invalidArguments, "\"path\" must be relative to the mount root, without '..'"))
            }
            return .success(path)
        case (nil, true?):
            return .success(nil)
        default:
            return .failure(ControlError(.invalidArguments, "\"faultClear\" needs either \"path\" or \"all\": true"))
        }
    }

    /// An errno name (EIO, econnreset) among those ProviderFS knows; numbers are not accepted (a
    /// number means different things on different systems).
    static func errnoNumber(_ name: String) -> Int32? {
        guard name.first?.isLetter == true, let errno = Errno(parsing: name) else { return nil }
        return errno.rawValue
    }

    static func boolean(_ value: Any) -> Bool? {
        guard let number = value as? NSNumber, String(describing: type(of: value)).contains("Boolean") else {
            return nil
        }
        return number.boolValue
    }
}

/// One fault as `faultList` (and `faultAdd`) answers it.
struct ControlFault: Codable, Sendable, Equatable {
    var path: String
    var identifier: String
    /// failAt, stall, truncate, corrupt, changeVersion, slow, offline.
    var fault: String
    /// A sentence: "fail at 4194304 with EIO".
    var description: String
    var at: Int64?
    var errno: String?
    var durationMilliseconds: Int64?
    var bytesPerSecond: Int64?
    /// The downloads it was given (nil: until cleared).
    var times: Int?
    /// Downloads still to come (nil: until cleared).
    var timesLeft: Int?
    /// Downloads it struck that still run.
    var running: Int
    var metadata: Bool
    /// "download" or "upload" (nil from a daemon that predates upload faults: download).
    var on: String?

    init(_ state: FaultRuleState) {
        let rule = state.rule
        path = rule.path ?? rule.identifier.rawValue
        identifier = rule.identifier.rawValue
        let request = FaultRequest(path: path, fault: rule.fault, times: nil, metadata: rule.metadata)
        fault = request.kind
        description = rule.fault.description
        at = rule.fault.offset
        if case .failAfter(_, let code) = rule.fault { errno = Errno(code).name }
        if case .stall(_, let duration?) = rule.fault {
            durationMilliseconds = Int64((duration.seconds * 1000).rounded())
        }
        if case .slow(let rate) = rule.fault { bytesPerSecond = rate }
        switch rule.times {
        case .downloads(let count), .fetches(let count): times = count
        case .untilCleared: times = nil
        }
        timesLeft = state.remaining
        running = state.running
        metadata = rule.metadata
        on = rule.on.rawValue
    }
}

struct ControlFaultList: Codable, Sendable, Equatable {
    var faults: [ControlFault]
}

struct ControlFaultCleared: Codable, Sendable, Equatable {
    var cleared: Int
}

/// The daemon's side: a mount's fault plan and its file system (to resolve paths).
struct MountFaults: Sendable {
    let plan: FaultPlan
    let fileSystem: ProviderFileSystem

    func handle(_ request: ControlRequest) async -> Result<[UInt8], ControlError>? {
        switch request {
        case .faultAdd(let request):
            do { return ControlProtocol.encode(try await add(request)) } catch { return .failure(error) }
        case .faultList:
            return ControlProtocol.encode(ControlFaultList(faults: plan.states.map(ControlFault.init)))
        case .faultClear(let path):
            let cleared = path.map { plan.clear(path: $0) } ?? plan.clear()
            if let path, cleared == 0 {
                return .failure(
                    ControlError(.notFound, "there is no fault on \(path.isEmpty ? "the mount root" : path)"))
            }
            return ControlProtocol.encode(ControlFaultCleared(cleared: cleared))
        default:
            return nil
        }
    }

    /// Resolves the path to the provider's identifier (through the file system, as a lookup
    /// would), then adds the rule. A path that cannot be looked up now (its item is already
    /// offline) keeps the identifier an earlier fault on the same path recorded.
    func add(_ request: FaultRequest) async throws(ControlError) -> ControlFault {
        let identifier: ItemIdentifier
        do {
            identifier = try await fileSystem.status(ofPath: request.path).identifier
        } catch {
            if let known = plan.all.first(where: { $0.path == request.path }) {
                identifier = known.identifier
            } else {
                throw MountControl.controlError(error, path: request.path)
            }
        }
        let rule = FaultRule(
            identifier: identifier, path: request.path, fault: request.fault, times: request.faultTimes,
            metadata: request.metadata, on: request.on)
        plan.add(rule)
        return ControlFault(FaultRuleState(rule: rule, used: 0, running: 0))
    }
}
