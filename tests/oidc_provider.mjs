// A real OpenID Connect provider for the tests: oauth2-mock-server (npm, pinned in
// package.json, installed by `make setup`) on 127.0.0.1, signing with an RS256 key it makes at
// start. tests/oidc.py runs it; by hand:
//
//   node tests/oidc_provider.mjs [--port N] [--token-ttl SECONDS] [--exit-with-stdin]
//
// Port 0 (the default) takes a free port. Once listening it prints one JSON line to stdout,
// {"issuer": "http://127.0.0.1:PORT", "port": PORT}, and nothing else there (logs go to
// stderr).
//
// The library's endpoints are kept, with what a provider the app can be tested against needs
// and the mock lacks (it accepts any code, ignores a missing code_verifier and signs everyone in
// as "johndoe"):
//
// - GET /authorize signs in the provider's current user (POST /test/sign-in) and redirects
//   back with a code at once, as a provider with a live session does. With no session (or
//   prompt=login) it shows a login form: typing a user name known to the provider (POST
//   /test/users or /test/sign-in) signs that user in, and starts the session. prompt=none
//   without a session redirects back with error=login_required. PKCE with S256 is required.
// - POST /token: a code is good once, for 60 s, for the client and redirect_uri it was issued
//   to, and only with the code_verifier of its code_challenge; refresh tokens likewise, rotated
//   on use. Other grants are refused. (400 in each case: invalid_grant from the checks here,
//   invalid_request where the library's own PKCE check refuses first: a wrong verifier, a
//   reused code.) The ID and access tokens carry the user's claims (sub, name, email,
//   preferred_username, groups, ragchains_role), aud = the client_id, and last --token-ttl
//   seconds (POST /test/config changes it). Client secrets are never checked.
// - GET /.well-known/openid-configuration says what this provider does (S256 only, the two
//   grants), where the library's document offers more.
// - GET /userinfo answers for an access token this provider issued, until it expires.
// - GET /endsession ends the provider's session (the next /authorize shows the form) and
//   redirects to post_logout_redirect_uri (with the state), or says so on a page without one.
//
// Control routes for the tests (JSON in, JSON out):
//   POST /test/users    {sub, name?, email?, groups?, role?}  a user the login form knows
//   POST /test/sign-in  {the same}   that user, and the one /authorize signs in from now on
//   POST /test/sign-out              no session (as after /endsession)
//   POST /test/token    {sub, name?, email?, groups?, role?, aud?, expires_in?, claims?}
//                       -> {access_token}: a JWT signed by the provider's key, aud "ragchains"
//                       unless given; expires_in may be negative (an expired token); claims
//                       are set last (e.g. a wrong iss)
//   POST /test/config   {token_ttl}

import { createHash, randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';
import { HttpServer, OAuth2Issuer, OAuth2Service } from 'oauth2-mock-server';

const CODE_TTL = 60;
const ROLE_CLAIM = 'ragchains_role';

const { values: args } = parseArgs({
  options: {
    port: { type: 'string', default: '0' },
    'token-ttl': { type: 'string', default: '3600' },
    // Exit when stdin closes: the test process that started us has gone, even by SIGKILL.
    'exit-with-stdin': { type: 'boolean', default: false },
  },
});

let tokenTtl = wholeNumber(args['token-ttl'], '--token-ttl');
const users = new Map(); // sub -> user
let session = null; // the sub /authorize signs in without asking
const codes = new Map(); // code -> {user, clientId, redirectUri, challenge, nonce, scope, ...}
const refreshTokens = new Map(); // refresh token -> {user, clientId, scope, authTime}
const accessTokens = new Map(); // access token -> {user, exp}, for /userinfo
const signings = new WeakMap(); // token request -> tokens signed for it so far

const issuer = new OAuth2Issuer();
await issuer.keys.generate('RS256');
const service = new OAuth2Service(issuer);

function now() {
  return Math.floor(Date.now() / 1000);
}

function wholeNumber(text, what) {
  const value = Number(text);
  if (!Number.isInteger(value)) throw new Error(`${what} must be a whole number, not ${text}`);
  return value;
}

class BadRequest extends Error {}

function userFrom(body) {
  const { sub, name, email, groups = [], role = 'reader' } = body;
  if (typeof sub !== 'string' || sub === '') throw new BadRequest('sub: a non-empty string');
  if (!Array.isArray(groups) || !groups.every((g) => typeof g === 'string')) {
    throw new BadRequest('groups: a list of strings');
  }
  if (role !== null && typeof role !== 'string') throw new BadRequest('role: a string or null');
  return {
    sub,
    name: typeof name === 'string' ? name : sub,
    email: typeof email === 'string' ? email : `${sub}@example.com`,
    groups,
    role,
  };
}

function userClaims(user) {
  const claims = {
    sub: user.sub,
    name: user.name,
    email: user.email,
    email_verified: true,
    preferred_username: user.sub,
    groups: user.groups,
  };
  if (user.role !== null) claims[ROLE_CLAIM] = user.role;
  return claims;
}

function pkceMatches(verifier, record) {
  if (typeof verifier !== 'string' || !/^[A-Za-z0-9\-._~]{43,128}$/.test(verifier)) return false;
  const challenge = createHash('sha256').update(verifier).digest('base64url');
  return challenge === record.challenge;
}

// --- the library's hooks ------------------------------------------------------------------

// From HTTP Basic authentication (client_secret_basic: the id form-encoded, RFC 6749 2.3.1)
// or the form (none, client_secret_post).
function clientIdOf(req) {
  const basic = /^Basic (\S+)$/i.exec(req.headers.authorization ?? '');
  if (basic === null) return req.body.client_id;
  const credentials = Buffer.from(basic[1], 'base64').toString('utf8');
  const colon = credentials.indexOf(':');
  const id = colon === -1 ? credentials : credentials.slice(0, colon);
  try {
    return decodeURIComponent(id.replaceAll('+', ' '));
  } catch {
    return id;
  }
}

// The record (a code's or a refresh token's) a token request is good for, or why not.
function grantOf(req) {
  const body = req.body;
  const clientId = clientIdOf(req);
  if (body.grant_type === 'authorization_code') {
    const record = codes.get(body.code);
    if (record === undefined) return { error: 'invalid_grant', why: 'unknown or used code' };
    if (record.expiresAt < now()) return { error: 'invalid_grant', why: 'the code expired' };
    if (clientId !== record.clientId) {
      return { error: 'invalid_grant', why: 'the code was issued to another client' };
    }
    if (body.redirect_uri !== record.redirectUri) {
      return { error: 'invalid_grant', why: 'redirect_uri differs from the authorization request' };
    }
    if (!pkceMatches(body.code_verifier, record)) {
      return { error: 'invalid_grant', why: 'code_verifier does not match the code_challenge' };
    }
    return { record, clientId };
  }
  if (body.grant_type === 'refresh_token') {
    const record = refreshTokens.get(body.refresh_token);
    if (record === undefined) {
      return { error: 'invalid_grant', why: 'unknown or used refresh token' };
    }
    if (clientId !== record.clientId) {
      return { error: 'invalid_grant', why: 'the refresh token was issued to another client' };
    }
    return { record, clientId };
  }
  return { error: 'unsupported_grant_type', why: `grant_type ${body.grant_type} is not offered` };
}

// The library signs the access token first, then the ID token, for the same request.
service.on('beforeTokenSigning', (token, req) => {
  const n = signings.get(req) ?? 0;
  signings.set(req, n + 1);
  const { record, clientId } = grantOf(req);
  if (record === undefined) return; // refused in beforeResponse
  const payload = token.payload;
  delete payload.nonce;
  Object.assign(payload, userClaims(record.user), {
    aud: clientId,
    exp: payload.iat + tokenTtl,
    jti: randomUUID(),
  });
  if (n === 0) {
    Object.assign(payload, { client_id: clientId, scope: record.scope });
  } else {
    delete payload.scope;
    payload.auth_time = record.authTime;
    payload.azp = clientId;
    if (req.body.grant_type === 'authorization_code' && record.nonce !== undefined) {
      payload.nonce = record.nonce;
    }
  }
});

service.on('beforeResponse', (response, req) => {
  const { record, clientId, error, why } = grantOf(req);
  if (req.body.grant_type === 'authorization_code') codes.delete(req.body.code);
  if (req.body.grant_type === 'refresh_token') refreshTokens.delete(req.body.refresh_token);
  if (record === undefined) {
    response.statusCode = 400;
    response.body = { error, error_description: why };
    return;
  }
  const body = response.body;
  body.expires_in = tokenTtl;
  body.scope = record.scope;
  accessTokens.set(body.access_token, { user: record.user, exp: now() + tokenTtl });
  refreshTokens.set(body.refresh_token, {
    user: record.user,
    clientId,
    scope: record.scope,
    authTime: record.authTime,
  });
});

service.on('beforeAuthorizeRedirect', (redirect, req) => {
  const code = redirect.url.searchParams.get('code');
  if (code === null || req.signedIn === undefined) return;
  const q = new URL(req.url, issuer.url).searchParams;
  codes.set(code, {
    user: req.signedIn,
    clientId: q.get('client_id'),
    redirectUri: q.get('redirect_uri'),
    challenge: q.get('code_challenge'),
    nonce: q.get('nonce') ?? undefined,
    scope: q.get('scope') ?? 'openid',
    authTime: req.authTime,
    expiresAt: now() + CODE_TTL,
  });
});

service.on('beforeUserinfo', (response, req) => {
  const bearer = /^Bearer (\S+)$/i.exec(req.headers.authorization ?? '');
  const issued = bearer && accessTokens.get(bearer[1]);
  if (!issued || issued.exp <= now()) {
    response.statusCode = 401;
    response.body = { error: 'invalid_token', error_description: 'unknown or expired token' };
    return;
  }
  response.body = userClaims(issued.user);
});

// --- what the library leaves out --------------------------------------------------------

function escape(text) {
  return String(text).replace(
    /[&<>"']/g,
    (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c],
  );
}

function send(res, status, type, text, headers = {}) {
  res.writeHead(status, {
    'Content-Type': type,
    'Content-Length': Buffer.byteLength(text),
    'Cache-Control': 'no-store',
    ...headers,
  });
  res.end(text);
}

function sendJson(res, status, value) {
  send(res, status, 'application/json', JSON.stringify(value));
}

function page(title, body) {
  return (
    '<!doctype html><html lang="en"><head><meta charset="utf-8">' +
    `<title>${title}</title></head><body><main><h1>${title}</h1>${body}</main></body></html>`
  );
}

function loginForm(res, params, problem) {
  const hidden = [...params]
    .filter(([name]) => name !== 'username')
    .map(([name, value]) => `<input type="hidden" name="${escape(name)}" value="${escape(value)}">`)
    .join('');
  const said = problem ? `<p role="alert">${escape(problem)}</p>` : '';
  const form =
    `${said}<form method="get" action="/authorize">${hidden}` +
    '<label>User name <input name="username" autocomplete="username" required autofocus></label> ' +
    '<button type="submit">Sign in</button></form>';
  const html = page('Sign in to the test provider', form);
  send(res, problem ? 401 : 200, 'text/html; charset=utf-8', html);
}

function redirectBack(res, redirectUri, params, error, description) {
  const url = new URL(redirectUri);
  url.searchParams.set('error', error);
  url.searchParams.set('error_description', description);
  if (params.get('state')) url.searchParams.set('state', params.get('state'));
  res.writeHead(302, { Location: url.href, 'Content-Length': 0 });
  res.end();
}

// Who this authorization request signs in, or false when it was answered here (the form,
// an error). The library then issues the code.
function authorize(req, res, params) {
  const redirectUri = params.get('redirect_uri');
  try {
    new URL(redirectUri);
  } catch {
    sendJson(res, 400, { error: 'invalid_request', error_description: 'redirect_uri: a URL' });
    return false;
  }
  if (!params.get('client_id')) {
    redirectBack(res, redirectUri, params, 'invalid_request', 'client_id is required');
    return false;
  }
  if (params.get('response_type') !== 'code') return true; // the library's own error
  if (!params.get('code_challenge') || params.get('code_challenge_method') !== 'S256') {
    redirectBack(res, redirectUri, params, 'invalid_request', 'PKCE with S256 is required');
    return false;
  }
  const prompt = (params.get('prompt') ?? '').split(' ');
  const typed = params.get('username');
  if (typed !== null) {
    const user = users.get(typed);
    if (user === undefined) {
      loginForm(res, params, `No user ${typed} here.`);
      return false;
    }
    session = { sub: user.sub, authTime: now() };
  } else if (session === null || prompt.includes('login')) {
    if (prompt.includes('none')) {
      redirectBack(res, redirectUri, params, 'login_required', 'nobody is signed in');
      return false;
    }
    loginForm(res, params);
    return false;
  }
  req.signedIn = users.get(session.sub);
  req.authTime = session.authTime;
  return true;
}

// The library's document offers grants, PKCE methods and client authentication this provider
// refuses or never checks; this one says what it does.
function discovery(res) {
  const at = (path) => `${issuer.url}${path}`;
  sendJson(res, 200, {
    issuer: issuer.url,
    authorization_endpoint: at('/authorize'),
    token_endpoint: at('/token'),
    userinfo_endpoint: at('/userinfo'),
    jwks_uri: at('/jwks'),
    end_session_endpoint: at('/endsession'),
    revocation_endpoint: at('/revoke'),
    introspection_endpoint: at('/introspect'),
    response_types_supported: ['code'],
    response_modes_supported: ['query'],
    grant_types_supported: ['authorization_code', 'refresh_token'],
    subject_types_supported: ['public'],
    id_token_signing_alg_values_supported: ['RS256'],
    // A client's secret is never checked; its id is (a code is good for its client only).
    token_endpoint_auth_methods_supported: ['none', 'client_secret_basic', 'client_secret_post'],
    code_challenge_methods_supported: ['S256'],
    scopes_supported: ['openid', 'profile', 'email'],
    claims_supported: [
      'sub', 'iss', 'aud', 'exp', 'iat', 'auth_time', 'nonce', 'name', 'email',
      'email_verified', 'preferred_username', 'groups', ROLE_CLAIM,
    ],
  });
}

function endSession(res, params) {
  session = null;
  if (params.has('post_logout_redirect_uri')) return true; // the library redirects
  send(res, 200, 'text/html; charset=utf-8', page('Signed out', '<p>You are signed out.</p>'));
  return false;
}

async function readJson(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const text = Buffer.concat(chunks).toString('utf8');
  if (text === '') return {};
  try {
    return JSON.parse(text);
  } catch {
    throw new BadRequest('the body is not JSON');
  }
}

async function control(req, res, path) {
  if (req.method !== 'POST') return sendJson(res, 405, { error: 'POST only' });
  const body = await readJson(req);
  if (path === '/test/users' || path === '/test/sign-in') {
    const user = userFrom(body);
    users.set(user.sub, user);
    if (path === '/test/sign-in') session = { sub: user.sub, authTime: now() };
    return sendJson(res, 200, { user });
  }
  if (path === '/test/sign-out') {
    session = null;
    return sendJson(res, 200, {});
  }
  if (path === '/test/token') {
    const user = userFrom(body);
    const { aud = 'ragchains', expires_in: expiresIn = 3600, claims = {} } = body;
    if (!Number.isInteger(expiresIn)) throw new BadRequest('expires_in: a whole number');
    if (typeof claims !== 'object' || claims === null) throw new BadRequest('claims: an object');
    const accessToken = await issuer.buildToken({
      expiresIn,
      scopesOrTransform: (_header, payload) => {
        Object.assign(payload, userClaims(user), { aud, jti: randomUUID() }, claims);
      },
    });
    accessTokens.set(accessToken, { user, exp: now() + expiresIn });
    return sendJson(res, 200, { access_token: accessToken });
  }
  if (path === '/test/config') {
    tokenTtl = wholeNumber(body.token_ttl, 'token_ttl');
    return sendJson(res, 200, { token_ttl: tokenTtl });
  }
  return sendJson(res, 404, { error: `no ${path}` });
}

async function listener(req, res) {
  const url = new URL(req.url, issuer.url);
  try {
    if (url.pathname.startsWith('/test/')) return await control(req, res, url.pathname);
    // No icon, and no 404 either: a browser asks for one with the login page.
    if (url.pathname === '/favicon.ico') return res.writeHead(204).end();
    if (req.method === 'GET' && url.pathname === '/.well-known/openid-configuration') {
      return discovery(res);
    }
    if (req.method === 'GET' && url.pathname === '/authorize') {
      if (!authorize(req, res, url.searchParams)) return;
    }
    if (req.method === 'GET' && url.pathname === '/endsession') {
      if (!endSession(res, url.searchParams)) return;
    }
    service.requestHandler(req, res);
  } catch (error) {
    if (error instanceof BadRequest) return sendJson(res, 400, { error: error.message });
    console.error(error);
    if (!res.headersSent) sendJson(res, 500, { error: String(error) });
  }
}

// --- start ------------------------------------------------------------------------------

const server = new HttpServer(listener);
await server.start(wholeNumber(args.port, '--port'), '127.0.0.1');
const port = server.address().port;
// The library would name it http://localhost:PORT; the app and the browser reach 127.0.0.1.
issuer.url = `http://127.0.0.1:${port}`;

const stop = () => process.exit(0);
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
if (args['exit-with-stdin']) {
  process.stdin.on('end', stop);
  process.stdin.on('error', stop);
  process.stdin.resume();
}
process.stdout.write(`${JSON.stringify({ issuer: issuer.url, port })}\n`);
