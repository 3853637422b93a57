// Pluggable device storage: a Storage maps names to strings (get returns null for a missing name). The device
// keeps its secret memo keys, its memoized cells and its privacy ledger there: a storage that loses or rolls
// back its contents makes the device refuse to report (or, without its ledger, start over as a new device).

/** In memory only: tests, short-lived devices (everything is lost with the object). */
export class MemoryStorage {
  constructor(entries = {}) {
    this.map = new Map(Object.entries(entries));
  }

  get(name) {
    return this.map.has(name) ? this.map.get(name) : null;
  }

  set(name, value) {
    this.map.set(name, String(value));
  }

  remove(name) {
    this.map.delete(name);
  }

  list() {
    return [...this.map.keys()];
  }
}

/** The browser's localStorage (or any object with getItem/setItem/removeItem), under a key prefix. */
export class LocalStorageStorage {
  constructor(prefix = 'ldp-device/', store = globalThis.localStorage) {
    if (!store || typeof store.getItem !== 'function') throw new Error('no localStorage on this platform');
    this.prefix = prefix;
    this.store = store;
  }

  get(name) {
    const v = this.store.getItem(this.prefix + name);
    return v === undefined ? null : v;
  }

  set(name, value) {
    this.store.setItem(this.prefix + name, String(value)); // throws (QuotaExceededError) rather than losing state
  }

  remove(name) {
    this.store.removeItem(this.prefix + name);
  }
}

/**
 * Node: one file per name in a directory (mode 0700, files 0600). Writes are atomic: a temporary file in the
 * same directory, fsync, rename over the old one, fsync of the directory: a reader sees the old contents or the
 * new, never a mix. lock() takes the directory for one Device at a time (a `.lock` file holding the pid).
 */
export class FileStorage {
  /** `new FileStorage(dir, {fs, path})` with Node's modules is ready at once; else await `FileStorage.open(dir)`. */
  constructor(dir, { fs = null, path = null } = {}) {
    this.dir = dir;
    this.fs = fs;
    this.path = path;
    this.locked = false;
    if (fs && path) this.prepare();
  }

  prepare() {
    this.fs.mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    if (this.fs.statSync(this.dir).mode & 0o077) this.fs.chmodSync(this.dir, 0o700);
  }

  async init() {
    if (!this.fs) this.fs = await import('node:fs');
    if (!this.path) this.path = await import('node:path');
    this.prepare();
    return this;
  }

  /** FileStorage.open(dir): a ready storage (Node's fs is loaded on demand, so browsers can import this module). */
  static async open(dir) {
    return new FileStorage(dir).init();
  }

  file(name) {
    if (!/^[A-Za-z0-9_.:-]{1,200}$/.test(name) || name === '.lock' || name.endsWith('.tmp') || name === '.' || name === '..') {
      throw new Error(`bad storage name ${JSON.stringify(name)}`);
    }
    return this.path.join(this.dir, name);
  }

  get(name) {
    try {
      return this.fs.readFileSync(this.file(name), 'utf8');
    } catch (exc) {
      if (exc.code === 'ENOENT') return null;
      throw exc;
    }
  }

  set(name, value) {
    const { fs } = this;
    const target = this.file(name);
    const tmp = this.path.join(this.dir, `.${name}.${process.pid}.${Math.random().toString(16).slice(2)}.tmp`);
    const fd = fs.openSync(tmp, 'wx', 0o600);
    try {
      fs.writeFileSync(fd, String(value));
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    try {
      fs.renameSync(tmp, target);
    } catch (exc) {
      fs.rmSync(tmp, { force: true });
      throw exc;
    }
    try {
      const dfd = fs.openSync(this.dir, 'r');
      try { fs.fsyncSync(dfd); } finally { fs.closeSync(dfd); }
    } catch { /* directories cannot be fsynced on every platform */ }
  }

  remove(name) {
    this.fs.rmSync(this.file(name), { force: true });
  }

  list() {
    return this.fs.readdirSync(this.dir).filter((n) => n !== '.lock' && !n.endsWith('.tmp'));
  }

  lock() {
    const { fs } = this;
    const lockPath = this.path.join(this.dir, '.lock');
    for (let attempt = 0; attempt < 2; attempt++) {
      try {
        const fd = fs.openSync(lockPath, 'wx', 0o600);
        fs.writeFileSync(fd, String(process.pid));
        fs.closeSync(fd);
        this.locked = true;
        return;
      } catch (exc) {
        if (exc.code !== 'EEXIST') throw exc;
        const pid = Number(fs.readFileSync(lockPath, 'utf8'));
        let alive = false;
        if (Number.isInteger(pid) && pid > 0) {
          try { process.kill(pid, 0); alive = true; } catch (e) { alive = e.code === 'EPERM'; }
        }
        if (alive) throw new Error(`${this.dir} is in use by process ${pid}: one Device per state directory at a time`);
        fs.rmSync(lockPath, { force: true }); // left by a process that is gone
      }
    }
    throw new Error(`cannot lock ${this.dir}`);
  }

  unlock() {
    if (!this.locked) return;
    this.fs.rmSync(this.path.join(this.dir, '.lock'), { force: true });
    this.locked = false;
  }
}
