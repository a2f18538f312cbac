// stands for an installed public header
