/* Stand-in for wsl.exe, for running the installer under Wine
   (test/installer_wine.sh). Appends its command line to C:\wsl-log.txt and
   exits with the number in C:\wsl-exit<first argument>.txt if that file
   exists (e.g. C:\wsl-exit--import.txt), else 0. */
#include <windows.h>
#include <stdio.h>

int wmain(int argc, wchar_t **argv)
{
    FILE *f = _wfopen(L"C:\\wsl-log.txt", L"a, ccs=UTF-8");
    if (f) {
        fwprintf(f, L"%ls\n", GetCommandLineW());
        fclose(f);
    }
    int code = 0;
    if (argc > 1) {
        wchar_t p[512];
        swprintf(p, 512, L"C:\\wsl-exit%ls.txt", argv[1]);
        FILE *e = _wfopen(p, L"r");
        if (e) {
            if (fwscanf(e, L"%d", &code) != 1)
                code = 1;
            fclose(e);
        }
    }
    return code;
}
