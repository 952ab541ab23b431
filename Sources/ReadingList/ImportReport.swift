// `reading-list report`: the error matrix of recent import attempts, so that a failure is located
// without running it again.

import Foundation

public enum ImportReport {
    /// One block per attempt: when, what, from where, the result, the versions, and a row per
    /// stage with its outcome and duration.
    public static func table(_ attempts: [ImportAttempt]) -> String {
        guard !attempts.isEmpty else { return "no import attempts recorded" }
        var lines: [String] = []
        let formatter = ISO8601DateFormatter()
        let header = ImportStage.allCases.map { $0.rawValue.padding(toLength: 10, withPad: " ", startingAt: 0) }
        for attempt in attempts {
            var summary = "\(formatter.string(from: attempt.startedAt))  \(attempt.result.rawValue)"
            if let stage = attempt.failedStage { summary += " at \(stage.rawValue)" }
            summary += "  \(attempt.fileType)  \(attempt.sourceCategory.rawValue)  \(attempt.sourcePath)"
            lines.append(summary)
            if let error = attempt.error { lines.append("  error: \(error)") }
            if let document = attempt.documentID { lines.append("  document: \(document)") }
            lines.append("  system: \(attempt.versions.system)")
            if let provider = attempt.versions.provider { lines.append("  provider: \(provider)") }
            lines.append("  app: \(attempt.versions.app)")
            lines.append("  " + header.joined(separator: " "))
            let cells = ImportStage.allCases.map { stage -> String in
                guard let row = attempt.stages.first(where: { $0.stage == stage }) else {
                    return "-".padding(toLength: 10, withPad: " ", startingAt: 0)
                }
                let text =
                    row.outcome == .skipped ? "skipped" : "\(row.outcome.rawValue) \(Int(row.milliseconds.rounded()))ms"
                return text.padding(toLength: max(10, text.count), withPad: " ", startingAt: 0)
            }
            lines.append("  " + cells.joined(separator: " "))
            for row in attempt.stages where row.outcome != .ok && row.outcome != .skipped {
                if let detail = row.detail { lines.append("  \(row.stage.rawValue): \(detail)") }
            }
            lines.append("")
        }
        return lines.joined(separator: "\n")
    }
}
