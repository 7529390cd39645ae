// A coordinator on Node's built-in fetch (Node 18+, no packages): start a command through
// ttyserve's HTTP API, print its output as it comes, across dropped connections (each time
// asking again from the offsets it printed), and exit with the command's code.
//
//   node examples/coordinator.mjs http://127.0.0.1:7681/api/v1 TOKEN -- make test
const [url, token, dashes, ...argv] = process.argv.slice(2);
if (dashes !== "--" || argv.length === 0) {
  console.error("usage: coordinator.mjs URL TOKEN -- COMMAND...");
  process.exit(2);
}
const auth = { Authorization: `Bearer ${token}` };

const started = await fetch(`${url}/sessions`, {
  method: "POST", headers: auth, body: JSON.stringify({ argv, pty: false }),
});
if (started.status !== 201) {
  console.error(`not started: ${started.status} ${await started.text()}`);
  process.exit(1);
}
const { session } = await started.json();

const offsets = { stdout: 0, stderr: 0 };
const sinks = { stdout: process.stdout, stderr: process.stderr };
let exit = null;
while (exit === null) {
  try {
    const query = `stdout=${offsets.stdout}&stderr=${offsets.stderr}`;
    const answer = await fetch(`${url}/sessions/${session}/output?${query}`, { headers: auth });
    if (answer.status !== 200) throw new Error(`${answer.status} ${await answer.text()}`);
    const decoder = new TextDecoder();
    let buffered = "";
    for await (const piece of answer.body) {
      buffered += decoder.decode(piece, { stream: true });
      let end;
      while ((end = buffered.indexOf("\n")) >= 0) {
        const event = JSON.parse(buffered.slice(0, end));
        buffered = buffered.slice(end + 1);
        if (event.type === "output") {
          const data = Buffer.from(event.data, "base64");
          sinks[event.stream].write(data);
          offsets[event.stream] = event.offset + data.length;
        } else if (event.type === "exit") {
          exit = event;
        }
      }
    }
    if (exit === null) throw new Error("it ended before the exit");
  } catch (error) {
    console.error(`[the stream broke (${error.cause?.code ?? error.message}); ` +
                  `again from ${offsets.stdout},${offsets.stderr}]`);
  }
}
console.error(`[exit ${JSON.stringify(exit)}]`);
process.exitCode = exit.code >= 0 ? exit.code : 128 - exit.code;
