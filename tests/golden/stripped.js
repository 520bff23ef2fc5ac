const fs = require('fs'); const dns = require('dns');
setTimeout(() => {
  fs.statSync('/etc/hosts');
  try { fs.statSync('/no/such/file'); } catch (e) {}
  fs.readFile('/etc/hosts', (err, d) => {
    dns.lookup('localhost', (e, a) => {
      console.log('lookup', e && e.code, a);
      const t = Date.now(); while (Date.now() - t < 120) {}
      dns.lookup('nothing.invalid', (e2) => console.log('invalid', e2 && e2.code));
    });
  });
}, 50);
