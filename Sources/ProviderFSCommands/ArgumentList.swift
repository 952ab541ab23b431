import SystemSupport

/// The arguments of one command, consumed as they are understood.
///
/// Commands take their flags and positionals out of the list and call `finish()`; whatever is
/// left (an unknown flag, an extra operand) is then a usage error naming it. Flags accept
/// `--name value` and `--name=value`. Everything after a lone `--` is kept verbatim.
public struct ArgumentList: Sendable {
    private var items: [String]
    /// Arguments after `--`, untouched (for `coordinate … -- CMD ARGS`).
    public private(set) var trailing: [String]?
    public let commandName: String

    public init(_ arguments: [String], commandName: String) {
        self.commandName = commandName
        if let separator = arguments.firstIndex(of: "--") {
            items = Array(arguments[..<separator])
            trailing = Array(arguments[(separator + 1)...])
        } else {
            items = arguments
            trailing = nil
        }
    }

    /// True when `--name` is present (and removes it). `--name=…` is a usage error for a plain flag.
    public mutating func flag(_ name: String) throws(UsageError) -> Bool {
        if let bad = items.first(where: { $0.hasPrefix(name + "=") }) {
            throw UsageError("\(commandName): \(name) takes no value (got '\(bad)').")
        }
        guard let index = items.firstIndex(of: name) else { return false }
        items.remove(at: index)
        return true
    }

    /// The value of `--name VALUE` or `--name=VALUE`, or nil when absent.
    public mutating func option(_ name: String) throws(UsageError) -> String? {
        if let index = items.firstIndex(where: { $0.hasPrefix(name + "=") }) {
            let value = String(items[index].dropFirst(name.count + 1))
            items.remove(at: index)
            guard !value.isEmpty else { throw UsageError("\(commandName): \(name) needs a value.") }
            return value
        }
        guard let index = items.firstIndex(of: name) else { return nil }
        guard index + 1 < items.count, !items[index + 1].hasPrefix("--") || items[index + 1] == "-" else {
            throw UsageError("\(commandName): \(name) needs a value.")
        }
        let value = items[index + 1]
        items.removeSubrange(index...(index + 1))
        return value
    }

    /// `--name` alone, or `--name=VALUE`: returns nil when absent, "" when bare, else the value.
    public mutating func optionalValueFlag(_ name: String) -> String? {
        if let index = items.firstIndex(where: { $0.hasPrefix(name + "=") }) {
            let value = String(items[index].dropFirst(name.count + 1))
            items.remove(at: index)
            return value
        }
        guard let index = items.firstIndex(of: name) else { return nil }
        items.remove(at: index)
        return ""
    }

    /// `--name` alone, `--name=VALUE`, or `--name VALUE` when the next argument is one (`accepts`
    /// says so; otherwise it stays, e.g. as an operand): nil when absent, "" when bare.
    public mutating func optionalValueFlag(_ name: String, valueIf accepts: (String) -> Bool) -> String? {
        if let index = items.firstIndex(of: name), index + 1 < items.count, !items[index + 1].hasPrefix("--"),
            accepts(items[index + 1])
        {
            let value = items[index + 1]
            items.removeSubrange(index...(index + 1))
            return value
        }
        return optionalValueFlag(name)
    }

    public mutating func duration(_ name: String) throws(UsageError) -> Duration? {
        guard let text = try option(name) else { return nil }
        do { return try parseDuration(text) } catch { throw UsageError("\(commandName): \(name): \(error).") }
    }

    public mutating func size(_ name: String) throws(UsageError) -> Int64? {
        guard let text = try option(name) else { return nil }
        do { return try parseSize(text) } catch { throw UsageError("\(commandName): \(name): \(error).") }
    }

    /// The next operand (an argument that is not a flag), or nil when none is left.
    public mutating func positional() -> String? {
        guard let index = items.firstIndex(where: { !$0.hasPrefix("--") || $0 == "-" }) else { return nil }
        return items.remove(at: index)
    }

    /// The next operand, or a usage error that names what was expected.
    public mutating func requiredPositional(_ what: String) throws(UsageError) -> String {
        guard let value = positional() else { throw UsageError("\(commandName): missing \(what).") }
        return value
    }

    /// Fails on anything not consumed: an unknown flag or an extra operand.
    public func finish() throws(UsageError) {
        if let first = items.first {
            if first.hasPrefix("-") && first != "-" {
                throw UsageError("\(commandName): unknown option '\(first)'.")
            }
            throw UsageError("\(commandName): unexpected argument '\(first)'.")
        }
    }
}
