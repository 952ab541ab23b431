// The `reading-list` command line (the executable's parser, here so that it can be tested).
public struct ReadingListUsageError: Error, Sendable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// The `reading-list` command line, parsed strictly: an unknown flag is an error. Options may
/// come before the command or after it (`reading-list --data-dir D list` as well as
/// `reading-list list --data-dir D`): the command is the first operand.
public struct ReadingListArguments: Sendable {
    public var command = ""
    public var operands: [String] = []
    public var json = false
    public var strict = false
    public var cat = false
    public var passwordFile: String?
    public var dataDirectory: String?
    public var limit = 50

    public init(_ raw: [String]) throws(ReadingListUsageError) {
        var index = 0
        func value(_ flag: String) throws(ReadingListUsageError) -> String {
            index += 1
            guard index < raw.count, !raw[index].isEmpty else { throw ReadingListUsageError("\(flag) needs a value") }
            return raw[index]
        }
        var operandsOnly = false
        var words: [String] = []  // the command, then its operands
        while index < raw.count {
            let argument = raw[index]
            if operandsOnly || !argument.hasPrefix("-") || argument == "-" {
                words.append(argument)
            } else {
                var flag = argument
                var inline: String?
                if let equals = argument.firstIndex(of: "="), argument.hasPrefix("--") {
                    flag = String(argument[..<equals])
                    inline = String(argument[argument.index(after: equals)...])
                }
                func take() throws(ReadingListUsageError) -> String {
                    if let inline {
                        guard !inline.isEmpty else { throw ReadingListUsageError("\(flag) needs a value") }
                        return inline
                    }
                    return try value(flag)
                }
                switch flag {
                case "--": operandsOnly = true
                case "--json": json = true
                case "--strict": strict = true
                case "--cat": cat = true
                case "--password-file": passwordFile = try take()
                case "--data-dir": dataDirectory = try take()
                case "--limit":
                    let text = try take()
                    guard let number = Int(text), number > 0, number <= 100_000 else {
                        throw ReadingListUsageError("--limit needs a count from 1 to 100000, not '\(text)'")
                    }
                    limit = number
                default: throw ReadingListUsageError("unknown option '\(argument)'")
                }
                if inline != nil, ["--json", "--strict", "--cat", "--"].contains(flag) {
                    throw ReadingListUsageError("\(flag) takes no value")
                }
            }
            index += 1
        }
        guard let first = words.first else { throw ReadingListUsageError("no command given") }
        command = first
        self.operands = Array(words.dropFirst())
        let allowed: [String: Set<String>] = [
            "import": ["json", "strict", "password"], "list": ["json"], "open": ["cat"], "remove": [],
            "reconcile": ["json"], "report": ["json", "limit"],
        ]
        guard let flags = allowed[command] else { throw ReadingListUsageError("unknown command '\(command)'") }
        let used: [(String, Bool)] = [
            ("json", json), ("strict", strict), ("cat", cat), ("password", passwordFile != nil), ("limit", limit != 50),
        ]
        for (name, set) in used where set && !flags.contains(name) {
            throw ReadingListUsageError("'\(command)' does not take --\(name == "password" ? "password-file" : name)")
        }
        switch command {
        case "import": guard !operands.isEmpty else { throw ReadingListUsageError("import needs at least one PATH") }
        case "open", "remove":
            guard operands.count == 1 else { throw ReadingListUsageError("\(command) needs exactly one ID") }
        default: guard operands.isEmpty else { throw ReadingListUsageError("\(command) takes no operands") }
        }
    }
}
