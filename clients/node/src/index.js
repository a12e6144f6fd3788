// leash-client: the gateway's side of `leash serve` (docs/protocol.md). Zero runtime
// dependencies; Node >= 20.
export { connect, LeashClient } from './client.js';
export { AttachStream } from './attach.js';
export { AcpChannel } from './acp.js';
export { spawn, execArgs, uuidv7, close, reap, verify, importAcpxState } from './spawn.js';
export { AcpxLifecycleController, CloseRefusedError } from './controller.js';
export { resolveStateDir, findSocket } from './locate.js';
export { simulate } from './simulate.js';
export { binaryPath, platformPackage, startDaemon, BinaryNotFoundError } from './binaries.js';
export * from './errors.js';
export { canSeeSessionRow, sessionRowGrant, sessionRequester, agentFromKey, rowAgent, parseA2aRule } from './visibility.js';
