// The `reading-list` command line: options before the command as well as after it (issue 24),
// and the strict checks that still apply wherever an option stands.

import ReadingList
import Testing

@Suite("reading-list arguments")
struct ArgumentsTests {
    @Test func optionsBeforeTheCommandAreAccepted() throws {
        let before = try ReadingListArguments(["--data-dir", "/d", "list"])
        #expect(before.command == "list" && before.operands.isEmpty && before.dataDirectory == "/d")
        let inline = try ReadingListArguments(["--data-dir=/d", "--json", "report", "--limit", "3"])
        #expect(inline.command == "report" && inline.dataDirectory == "/d" && inline.json && inline.limit == 3)
        let open = try ReadingListArguments(["--data-dir", "/d", "open", "ab12", "--cat"])
        #expect(open.command == "open" && open.operands == ["ab12"] && open.cat)
        let imports = try ReadingListArguments(["--data-dir", "/d", "import", "a.pdf", "b.pdf"])
        #expect(imports.command == "import" && imports.operands == ["a.pdf", "b.pdf"])
    }

    @Test func optionsAfterTheCommandStillWork() throws {
        let after = try ReadingListArguments(["list", "--data-dir", "/d", "--json"])
        #expect(after.command == "list" && after.operands.isEmpty && after.dataDirectory == "/d" && after.json)
        let operands = try ReadingListArguments(["import", "--strict", "--", "-odd.pdf", "list"])
        #expect(operands.command == "import" && operands.operands == ["-odd.pdf", "list"] && operands.strict)
    }

    @Test(arguments: [
        (["--data-dir", "/d"], "no command given"),
        (["--data-dir"], "--data-dir needs a value"),
        (["--frobnicate", "list"], "unknown option '--frobnicate'"),
        (["--cat", "list"], "'list' does not take --cat"),
        (["--data-dir", "/d", "list", "extra"], "list takes no operands"),
        (["--data-dir", "/d", "shelve"], "unknown command 'shelve'"),
    ])
    func stillRefused(arguments: [String], message: String) {
        #expect(throws: ReadingListUsageError.self) { try ReadingListArguments(arguments) }
        do {
            _ = try ReadingListArguments(arguments)
        } catch {
            #expect(error.description == message)
        }
    }
}
