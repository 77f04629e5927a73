// Subscribes with the reference graphql-ws client and prints one JSON line per event:
//   node subscribe.mjs <ws-url> <token> <query> <count>
// Lines: {"type":"connected"}, {"type":"next","payload":...} (count times), then it exits 0;
// {"type":"error",...} or {"type":"closed","code":...} and exit 1 when the server refuses.
import { createClient } from "graphql-ws";
import WebSocket from "ws";

const [url, token, query, count] = process.argv.slice(2);
const wanted = Number(count);
const print = (line) => process.stdout.write(JSON.stringify(line) + "\n");

const client = createClient({
  url,
  webSocketImpl: WebSocket,
  connectionParams: { authorization: `Bearer ${token}` },
  lazy: false,
  retryAttempts: 0,
  on: {
    connected: () => print({ type: "connected" }),
    closed: (event) => print({ type: "closed", code: event.code, reason: event.reason }),
  },
});

let received = 0;
const stop = client.subscribe(
  { query },
  {
    next: (payload) => {
      print({ type: "next", payload });
      received += 1;
      if (received >= wanted) {
        stop();
        client.dispose().then(() => process.exit(0));
      }
    },
    error: (error) => {
      print({ type: "error", error: error?.message ?? error?.reason ?? String(error), code: error?.code });
      client.dispose().then(() => process.exit(1));
    },
    complete: () => print({ type: "complete" }),
  },
);
