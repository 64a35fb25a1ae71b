// Talking to `attnlab serve` from the page: JSON GETs, the server's error shape, and server-sent events read
// from a streaming fetch. Every URL is relative, so the page also works behind a path prefix.

let apiKey = "";

export function useKey(key) { apiKey = key; }

export class ApiFailure extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

export function headers(json) {
  const h = json ? { "Content-Type": "application/json" } : {};
  if (apiKey) h.Authorization = `Bearer ${apiKey}`;
  return h;
}

// The server's errors are {"error": {"message", "type", "param", "code"}}: the message is for the user.
export async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch { /* not JSON: keep the status line */ }
  return new ApiFailure(response.status, message);
}

export async function getJSON(path) {
  const response = await fetch(path, { headers: headers(false) });
  if (!response.ok) throw await failure(response);
  return response.json();
}

// Server-sent events from a streaming response: each event's data, with the time its bytes were read.
export async function* readEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    const now = performance.now();
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const lines = buffer.slice(0, cut).split("\n");
      buffer = buffer.slice(cut + 2);
      const data = lines.filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (data) yield { data, now };
    }
  }
}
